"""python -m mpippo.suite run|status|report SUITE: the Procgen benchmark as one command.

A suite (games x seeds x variants) runs as one Slurm job array, or one member after another on this
machine; `status` says where each member stands, `report` scores the suite against the paper.

    python -m mpippo.suite run procgen_easy_16 --max-parallel 8   # sbatch one job array
    python -m mpippo.suite run configs/suites/mini.yaml --local   # here, one after another
    python -m mpippo.suite status procgen_easy_16                 # done / running / pending / failed
    python -m mpippo.suite report procgen_easy_16                 # report.md + figures vs the paper

SUITE is a file or a name under configs/suites/. `run` again submits only members that are not
done (and not queued), resuming those with a checkpoint.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

from mpippo.suite import spec
from mpippo.suite.spec import SuiteError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the trainer's
        sys.stderr.write(f"mpippo: error: suite: {message} (see python -m mpippo.suite --help)\n")
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m mpippo.suite", description=__doc__.splitlines()[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="{run,status,report}")
    run = sub.add_parser("run", help="submit (or run with --local) the members that are not done")
    run.add_argument("--local", action="store_true", help="run here, one member after another, no Slurm")
    run.add_argument("--max-parallel", type=int, default=None, help="array elements at once (sbatch's %%N)")
    run.add_argument("--sbatch-args", default="", help="extra sbatch options, one string (partition, account)")
    run.add_argument("--mpirun-args", default="--oversubscribe", help="--local: mpirun options, one string")
    run.add_argument("--dry-run", action="store_true", help="print what would run, submit nothing")
    sub.add_parser("status", help="a table of the members: done, running, pending, stopped, interrupted, failed")
    rep = sub.add_parser("report", help="report.md, tables and figures against the Procgen paper")
    rep.add_argument("--out", default=None, help="folder (default: the suite's folder, report/)")
    rep.add_argument("--reps", type=int, default=2000, help="bootstrap resamples for the intervals")
    mem = sub.add_parser("member")  # the array element's lookup (suite_member.sh); not in --help
    mem.add_argument("manifest")
    mem.add_argument("index", type=int)
    for s in (run, sub.choices["status"], rep):
        s.add_argument("suite", help="a suite file, or a name under configs/suites/")
        s.add_argument("--root", default="runs", help="where suites/<name>/ goes (default: runs)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "member":
            from pathlib import Path
            from mpippo.suite.submit import set_aside
            entry = spec.manifest_entry(args.manifest, args.index)
            aside = set_aside(Path(entry["folder"]))
            if aside:
                sys.stderr.write(f"mpippo: note: {entry['key']}: its last attempt left no checkpoint; "
                                 f"kept as {aside.name}\n")
            print("\n".join([entry["folder"], *entry["args"]]))
            return 0
        suite = spec.load(args.suite, args.root)
        return {"run": cmd_run, "status": cmd_status, "report": cmd_report}[args.cmd](suite, args)
    except SuiteError as e:
        sys.stderr.write(f"mpippo: error: {e.errors[0]}\n")
        return 2
    except OSError as e:  # a folder that cannot be made or written: its path and the reason
        sys.stderr.write(f"mpippo: error: suite: '{e.filename}': {e.strerror or e}\n")
        return 2
    except subprocess.TimeoutExpired as e:
        sys.stderr.write(f"mpippo: error: suite: '{e.cmd[0]}' did not answer within {e.timeout:.0f} s; try again\n")
        return 2
    except (KeyError, ValueError) as e:  # a manifest that is not the one the array was given
        sys.stderr.write(f"mpippo: error: suite: {e}\n")
        return 2


def cmd_run(suite: spec.Suite, args) -> int:
    from mpippo.suite import submit
    if args.max_parallel is not None and args.max_parallel < 1:
        raise SuiteError(f"--max-parallel: must be >= 1, got {args.max_parallel}")
    members = submit.todo(suite)
    total = len(suite.members())
    print(f"suite {suite.name}: {total - len(members)} of {total} members done or queued; "
          f"{len(members)} to {'run here' if args.local else 'submit'}", flush=True)
    if not members:
        return 0
    if args.dry_run:
        for m in members:
            print(f"  {m.index:>3} {m.key}: {'resume' if (m.folder / 'checkpoints' / 'latest.pt').is_file() else ' '.join(m.args)}")
        return 0
    if args.local:
        return submit.run_local(suite, members, args.mpirun_args)
    job = submit.submit_slurm(suite, members, args.max_parallel, shlex.split(args.sbatch_args))
    print(f"suite {suite.name}: submitted job array {job} ({len(members)} elements"
          f"{f', at most {args.max_parallel} at once' if args.max_parallel else ''}); "
          f"python -m mpippo.suite status {suite.path} follows it", flush=True)
    return 0


def cmd_status(suite: spec.Suite, args) -> int:
    from mpippo.suite import state
    state.print_table(suite, state.table(suite))
    return 0


def cmd_report(suite: spec.Suite, args) -> int:
    from mpippo.suite import report
    if args.reps < 1:
        raise SuiteError(f"--reps: bootstrap resamples must be >= 1, got {args.reps}")
    return report.main(suite, args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
