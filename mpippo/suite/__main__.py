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
import shutil
import subprocess
import sys
from pathlib import Path

from mpippo import config as C
from mpippo import files, runlock, toolcli
from mpippo.errors import FILE_SYSTEM_FULL, console_lost, let_readers_leave, os_reason
from mpippo.leftovers import temp_folder_problem
from mpippo.usage import UsageError, refusal
from mpippo.suite import spec, state, submit
from mpippo.suite.submit import set_aside
from mpippo.usage import Parser
from mpippo.suite.spec import SuiteError


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m mpippo.suite", what="suite", description=__doc__.splitlines()[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser, metavar="{run,status,report}")
    run = sub.add_parser("run", help="submit (or run with --local) the members that are not done")
    run.add_argument("--local", action="store_true", help="run here, one member after another, no Slurm")
    run.add_argument("--max-parallel", type=int, default=None, help="array elements at once (sbatch's %%N)")
    run.add_argument("--sbatch-args", default="", help="extra sbatch options, one string (partition, account)")
    run.add_argument("--mpirun-args", default="", help="--local: extra mpirun options, one string (binding: the launcher's)")
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


MAX_REPS = 100_000  # rliable's bootstrap: 2,000 is its default; beyond this it only costs minutes


def main(argv=None, settle: bool = False) -> int:
    """`settle`: this is the suite's own process (python -m mpippo.suite), whose stop signals stay
    ignored once a stop is decided (submit.Relay.close); tests call main in-process without it."""
    streams = let_readers_leave()  # (`suite status | head`: a 'Broken pipe' refusal, exit 2; member names hold any byte)
    try:
        args = parser().parse_args(argv)
        args.settle = settle
        if args.cmd == "member":
            return cmd_member(args)
        suite = spec.load(args.suite, args.root)
        code = {"run": cmd_run, "status": cmd_status, "report": cmd_report}[args.cmd](suite, args)
        if code == 0 and (lost := console_lost(f"its {args.cmd}'s lines from there on are lost")):  # (not exit 0)
            sys.stderr.write(refusal([lost], "suite: "))
            return 1
        return code
    except UsageError as e:  # SuiteError, a damaged file of the suite's (mpippo.files), a folder in use
        sys.stderr.write(refusal(e.errors))
        return 2
    except OSError as e:  # a folder that cannot be made or written: its path and the reason
        where = f"'{e.filename}': " if e.filename else ""
        sys.stderr.write(refusal([f"{where}{os_reason(e)}"], "suite: "))
        return 1 if e.errno in FILE_SYSTEM_FULL else 2  # (a full disk is no bad input)
    except KeyboardInterrupt:  # Ctrl-C before a member started (then the relay takes signals)
        sys.stderr.write("\nmpippo: suite: interrupted\n")
        return 130
    except subprocess.TimeoutExpired as e:
        sys.stderr.write(f"mpippo: error: suite: '{e.cmd[0]}' did not answer within {e.timeout:.0f} s; try again\n")
        return 2
    finally:
        sys.stdout, sys.stderr = streams


def cmd_member(args) -> int:
    """The array element's lookup: its folder and options, one a line (slurm/suite_member.sh)."""
    entry = spec.manifest_entry(args.manifest, args.index)
    folder = Path(entry["folder"])
    who = runlock.holder(folder)
    if who:
        raise SuiteError(f"suite member {entry['key']}: its folder '{folder}' is in use: {who} holds its lock; "
                         f"one writer per folder: this element leaves it alone")
    # the script appends the element's output to <folder>.log (bash's >> follows links, blocks on a FIFO)
    files.check_appendable(spec.log_path(folder), f"suite member {entry['key']}: its log")
    aside = set_aside(folder)
    if aside:
        sys.stderr.write(f"mpippo: note: {entry['key']}: its last attempt left no checkpoint; kept as {aside.name}\n")
    print("\n".join([entry["folder"], *entry["args"]]))  # (read_manifest refused line breaks in them)
    return 0


def _split(option: str, value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as e:
        raise SuiteError(f"suite run: {option}: {C.show(value)} is not a list of options as a shell would split "
                         f"it ({e})") from None


def cmd_run(suite: spec.Suite, args) -> int:
    if args.max_parallel is not None and not 1 <= args.max_parallel <= spec.MAX_MEMBERS:
        raise SuiteError(f"--max-parallel: must be in 1..{spec.MAX_MEMBERS}, got {args.max_parallel}")
    extra = _split("--sbatch-args", args.sbatch_args)
    _split("--mpirun-args", args.mpirun_args)
    if args.dry_run:  # decides as a run would, under no lock: it changes nothing
        elsewhere = []
        return _plan(suite, args, submit.todo(suite, elsewhere), elsewhere)
    if not args.local and not shutil.which("sbatch"):  # before anything is made
        raise SuiteError("suite run: sbatch is not on PATH (no Slurm here); use --local to run the members here")
    if args.local and (bad := temp_folder_problem()):  # (each member's launcher would refuse it, one by one)
        raise SuiteError(f"suite run --local: {bad}")
    with submit.SuiteLock(suite) as lock:
        elsewhere = []
        members = submit.todo(suite, elsewhere)
        if _plan(suite, args, members, elsewhere) is not None:
            lock.undo()  # nothing to do changes nothing
            return 0
        if args.local:
            return submit.run_local(suite, members, args.mpirun_args, lock.fds(), args.settle)
        job = submit.submit_slurm(suite, members, args.max_parallel, extra)
    print(f"suite {suite.name}: submitted job array {job} ({len(members)} elements"
          f"{f', at most {args.max_parallel} at once' if args.max_parallel else ''}); "
          f"python -m mpippo.suite status {suite.path} follows it", flush=True)
    return 0


def _plan(suite: spec.Suite, args, members: list, elsewhere: list = ()) -> int | None:
    """Say what this run does; 0 when that is the end of it (nothing to do, or a dry run)."""
    total = len(suite.members())
    print(f"suite {suite.name}: {total - len(members) - len(elsewhere)} of {total} members done or queued; "
          f"{len(members)} to {'run here' if args.local else 'submit'}", flush=True)
    for m, who in elsewhere:
        print(f"suite {suite.name}: {m.key} is running elsewhere ({who}); left to it", flush=True)
    if args.local and members and (note := _gpu_note(suite)):
        print(note, flush=True)
    if args.dry_run:
        for m in members:
            print(f"  {m.index:>3} {m.key}: {'resume' if state.has_checkpoint(m) else ' '.join(m.args)}")
        return 0
    return None if members else 0


def _gpu_note(suite: spec.Suite) -> str | None:
    """Where members that ask for GPUs run here without them (one member at a time needs a rank's)."""
    if not suite.gpus_per_rank:
        return None
    import torch
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have >= suite.gpus_per_rank:
        return None
    return (f"suite {suite.name}: note: its members ask for {suite.gpus_per_rank} GPU(s) per rank (gpus_per_rank) and "
            f"this machine has {have} usable: they run on the CPU here (training.device auto), far slower than its "
            f"time limit ({suite.time}) assumes")


def cmd_status(suite: spec.Suite, args) -> int:
    state.print_table(suite, state.table(suite))
    return 0


def cmd_report(suite: spec.Suite, args) -> int:
    from mpippo.suite import report  # numpy and rliable: only the report needs them
    if not 1 <= args.reps <= MAX_REPS:
        raise SuiteError(f"--reps: bootstrap resamples must be in 1..{MAX_REPS:,} (rliable's default: 2,000), "
                         f"got {args.reps:,}")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SuiteError(f"--out: '{args.out}' is not a folder (the report's files go into it)")
    return report.main(suite, args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main(settle=True))
