#!/usr/bin/env bash
# One lent GPU machine, one call (at most 600 s): what a session with an H100/H200 (16 cores, no
# network) runs first, from the repository's root.
#   a. installs the wheels carried in .devwheels/ (procgen, gym3, Open MPI, mpi4py, ale-py and Gymnasium for its Python:
#      `make devwheels` makes them) into the machine's Python, which holds torch with CUDA, and the
#      carried GL libraries procgen's libenv.so misses (.gl/);
#   b. the suite's missing members (issue 29; GPU_SESSION_SUITE, default mini) side by side on the one
#      GPU: one `python -m mpippo.launch -n 1 --output-dir <root>/suites/<suite>/<member> <its args>
#      --device cuda` per member, each pinned with taskset to its share of the cores (the launcher is
#      told --bind-to none, so its rank keeps that share: Open MPI's own binding would start every
#      rank at core 0). Stopped gracefully at the split below (SIGTERM to each launcher: the rank
#      checkpoints and stops, exit 4); a member with a checkpoint resumes in the next session;
#   c. make gpu-check's rows (benchmarks/gpu_check.py, shortened: 3 timed PPO iterations per row,
#      3 s per learner) on the then idle GPU, cut off at the end of its share (it rewrites its
#      result after every row, so a cut keeps the rows done);
#   d. into $OUT (at most 8 files come back: 16 MiB each, 64 MiB in all):
#        gpu-check.json, gpu-check-profile.txt (and -profile-trace.json.gz where it is small),
#        session.log (all of this script's output),
#        members.tgz (each member run here: benchmark_metrics.json, config.yaml, logs/, its console log),
#        ckpt.tar.NN (GPU_SESSION_CKPT=1, the default: the stopped members' folders with their
#        checkpoints/latest.pt only, in parts of at most 15 MiB, left out where they would not fit).
#
# The time split (seconds from the start; GPU_SESSION_LIMIT, default 560, bounds the whole):
#   until LIMIT - CHECK_S - STOP_S     the members train            (defaults: to 220 s)
#   the next STOP_S (default 40)        they checkpoint and stop      (a second Ctrl-C-like stop after it)
#   the last CHECK_S (default 300)      gpu-check, then the packing   (gpu-check gets CHECK_S - 20)
# With no member left to run (the mini suite is complete since 2026-11-28), gpu-check starts right
# after the set-up and has all the time left but the last 20 s.
#
# Choosing the members: the suite's own list of members to do (mpippo.suite's submit.todo, what
# `python -m mpippo.suite run <suite> --dry-run` prints), less the members the committed report
# (analysis/data/suites/<suite>/report.json, members/*/benchmark_metrics.json) has finished, less
# GPU_SESSION_SKIP ("variant/game/seed_N ..."), taken from the END of the suite's order (a local
# `suite run --local` goes from the front), at most GPU_SESSION_PARALLEL (default 4: 4 cores each on
# 16). GPU_SESSION_MEMBERS ("variant/game/seed_N ...") names them instead. A member folder that has
# a checkpoint resumes (--resume): carry the last session's ckpt.tar.NN files in GPU_SESSION_CARRIED
# (default .gpu-session/, git-ignored through .git/info/exclude; name it in the call's carry) and they
# are unpacked into the runs root first.
#
# GPU_SESSION_DRY=1 runs the same steps on the CPU with tiny budgets (no install; a fresh temporary
# runs root, never runs/; members of 4 envs x 32 steps on one core each; gpu-check --dry-run;
# LIMIT 300, CHECK_S 170), to try the script before spending device time.
set -u
cd "$(dirname "$0")/.." || exit 1
DRY=${GPU_SESSION_DRY:-}
if [ -n "$DRY" ]; then
    LIMIT=${GPU_SESSION_LIMIT:-300}; CHECK_S=${GPU_SESSION_CHECK_S:-170}; PARALLEL=${GPU_SESSION_PARALLEL:-2}
    PY=${PY:-.venv/bin/python}; RUNS=${GPU_SESSION_ROOT:-$(mktemp -d /tmp/gpu-session-dry.XXXXXX)/runs}
    DEV=cpu; CHECK=(--dry-run)
else
    LIMIT=${GPU_SESSION_LIMIT:-560}; CHECK_S=${GPU_SESSION_CHECK_S:-300}; PARALLEL=${GPU_SESSION_PARALLEL:-4}
    PY=${PY:-python3}; RUNS=${GPU_SESSION_ROOT:-runs}
    DEV=cuda; CHECK=(--ppo-iterations 3 --learner-seconds 3)
fi
STOP_S=${GPU_SESSION_STOP_S:-40}
SUITE=${GPU_SESSION_SUITE:-mini}
CKPT=${GPU_SESSION_CKPT:-1}
CARRIED=${GPU_SESSION_CARRIED:-.gpu-session}
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT" "$RUNS"
RUNS=$(cd "$RUNS" && pwd -P)  # absolute, as the suite names its members' folders
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=^ofi PYTHONUNBUFFERED=1
T0=$SECONDS
at() { echo $((SECONDS - T0)); }
left() { echo $((LIMIT - (SECONDS - T0))); }
WORK=$(mktemp -d /tmp/gpu-session-work.XXXXXX)

# the CUDA-only unit tests (skipped on CPU machines: the graphed policy step, fused Adam, the device
# replay and learners), where the carried pytest wheel is installed
cuda_tests() {
    if [ -z "${GPU_SESSION_DRY:-}" ] && "$PY" -m pytest --version > /dev/null 2>&1; then
        timeout -k 5 120 "$PY" -m pytest -q -p no:cacheprovider -k cuda tests/unit/test_policy_step.py \
            tests/unit/test_adam.py tests/unit/test_dqn_parts.py tests/unit/test_appo_parts.py > /tmp/cuda-tests.txt 2>&1
    fi
}

session() {
# ---------------------------------------------------------------- a. install and look around
if [ -z "$DRY" ]; then
    "$PY" -m pip install -q --no-deps --no-index .devwheels/*.whl 2>&1 | grep -v -i warn
fi
# procgen's libenv.so links libGL and X11, which a headless image may lack: the carried .deb files
# (.gl/, `make devwheels`) are unpacked aside and only the libraries the loader misses are put on
# LD_LIBRARY_PATH (the image's own stay in front of nothing they replace)
LIBENV=$("$PY" -c "import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec('procgen').origin), 'data/prebuilt/libenv.so'))")
if ls .gl/*.deb > /dev/null 2>&1; then
    mkdir -p /tmp/gl-root /tmp/gl-lib
    for f in .gl/*.deb; do dpkg -x "$f" /tmp/gl-root; done
    export LD_LIBRARY_PATH=/tmp/gl-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    for _ in 1 2 3 4; do
        for lib in $(ldd "$LIBENV" | awk '/not found/ {print $1}'); do
            find /tmp/gl-root -name "$lib" -exec cp -L {} /tmp/gl-lib/ \;
        done
    done
fi
ldd "$LIBENV" | grep "not found" && echo "procgen: libraries still missing"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; bf16 flags: $(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
"$PY" -c "import torch, numpy, procgen, mpi4py; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__)" || return 1
echo "session: set up at $(at) s; members until $((LIMIT - CHECK_S - STOP_S)) s, stopped by $((LIMIT - CHECK_S)) s, gpu-check until $((LIMIT - 20)) s"

# ---------------------------------------------------------------- b. the suite's missing members
if ls "$CARRIED"/ckpt.tar.* > /dev/null 2>&1; then  # the last session's stopped members
    cat "$CARRIED"/ckpt.tar.* | tar -x -C "$RUNS" && echo "session: unpacked $(ls "$CARRIED"/ckpt.tar.* | wc -l) carried checkpoint part(s) into $RUNS"
fi
SUITE="$SUITE" RUNS="$RUNS" PARALLEL="$PARALLEL" SKIP="${GPU_SESSION_SKIP:-}" MEMBERS="${GPU_SESSION_MEMBERS:-}" \
    DRY="$DRY" DEV="$DEV" "$PY" - > "$WORK/members.sh" <<'EOF' || return 1
import json, os, shlex, sys
from pathlib import Path
from mpippo.suite import spec, submit

suite = spec.load(os.environ["SUITE"], os.environ["RUNS"])
elsewhere = []
todo = submit.todo(suite, elsewhere)  # not done here, not queued, not being written
data = Path("analysis/data/suites") / suite.name  # what the committed report has finished
done = set()
if (data / "report.json").is_file():
    for m in json.loads((data / "report.json").read_text()).get("members", []):
        if (m.get("steps") or 0) >= suite.budget:
            done.add(f"{m['variant']}/{m['game']}/seed_{m['seed']}")
for f in (data / "members").glob("*/*/seed_*/benchmark_metrics.json"):
    m = json.loads(f.read_text())
    if m.get("finished") is True and (m.get("total_timesteps") or 0) >= suite.budget:
        done.add(str(f.parent.relative_to(data / "members")))
by = {m.key: m for m in todo}
want, skip = os.environ["MEMBERS"].split(), set(os.environ["SKIP"].split())
if want:
    for k in want:
        if k not in by:
            print(f"session: {k} is not a member left to do here; skipped", file=sys.stderr)
    chosen = [by[k] for k in want if k in by]
else:
    chosen = [m for m in reversed(todo) if m.key not in done and m.key not in skip]
chosen = chosen[:int(os.environ["PARALLEL"])]
print(f"session: suite {suite.name}: {len(todo)} member(s) left by the suite's own count, {len(done)} finished in the "
      f"committed report, running {len(chosen)}: {', '.join(m.key for m in chosen) or 'none'}", file=sys.stderr)
tiny = ["--num-envs-per-rank", "4", "--n-steps", "32", "--set", "training.num_minibatches=2",
        "--set", "training.n_epochs=1"] if os.environ["DRY"] else []
print(f"KEYS=({' '.join(shlex.quote(m.key) for m in chosen)})")
print(f"DIRS=({' '.join(shlex.quote(str(m.folder)) for m in chosen)})")
for i, m in enumerate(chosen):
    resume = (m.folder / "checkpoints" / "latest.pt").is_file()
    args = ["--resume"] if resume else [*m.args, *tiny]
    print(f"ARGS_{i}=({shlex.join([*args, '--device', os.environ['DEV'], '--no-progress'])})")
EOF
. "$WORK/members.sh"
N=${#KEYS[@]}
PIDS=()
if [ "$N" -gt 0 ]; then
    CORES=$(nproc); PER=$((CORES / N)); [ "$PER" -lt 1 ] && PER=1
    for i in $(seq 0 $((N - 1))); do
        lo=$(( (i * PER) % CORES )); hi=$((lo + PER - 1))
        args="ARGS_$i[@]"
        mkdir -p "$(dirname "${DIRS[$i]}")"
        if command -v taskset > /dev/null; then PIN=(taskset -c "$lo-$hi"); where="cores $lo-$hi"
        else PIN=(); where="all cores (no taskset here)"; fi
        "${PIN[@]}" "$PY" -m mpippo.launch -n 1 --mpirun-args="--bind-to none" --output-dir "${DIRS[$i]}" \
            "${!args}" >> "${DIRS[$i]}.log" 2>&1 &
        PIDS+=($!)
        echo "session: ${KEYS[$i]} on $where (launcher $!): ${!args}"
    done
    STOP_AT=$((LIMIT - CHECK_S - STOP_S))
    cuda_tests &  # meanwhile: a few seconds of the GPU beside the members
    while [ "$(at)" -lt "$STOP_AT" ]; do
        alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 2
    done
    echo "session: stopping the members at $(at) s"
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2> /dev/null; done  # the launcher: checkpoint and stop
    while [ "$(at)" -lt $((LIMIT - CHECK_S)) ]; do
        alive=0
        for p in "${PIDS[@]}"; do kill -0 "$p" 2> /dev/null && alive=1; done
        [ "$alive" -eq 0 ] && break
        sleep 1
    done
    for p in "${PIDS[@]}"; do  # still there: two Ctrl-C's (the second is the launcher's hard stop), then kill
        if kill -0 "$p" 2> /dev/null; then
            echo "session: launcher $p did not stop in time; stopping it hard"
            kill -INT "$p"; sleep 1; kill -INT "$p" 2> /dev/null; sleep 5; kill -KILL "$p" 2> /dev/null
        fi
    done
    for i in $(seq 0 $((N - 1))); do
        wait "${PIDS[$i]}"; rc=$?
        case $rc in 0) what="finished";; 4|3) what="stopped with a checkpoint";; *) what="ended with exit $rc";; esac
        steps=$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print(f\"{m.get('total_timesteps', 0):,} steps at {m.get('fps_steady') or m.get('fps') or 0:,.0f} steps/s\")" \
            "${DIRS[$i]}/benchmark_metrics.json" 2> /dev/null || echo "no metrics")
        echo "session: ${KEYS[$i]}: $what (exit $rc), $steps"
        tail -n 3 "${DIRS[$i]}.log" | sed 's/^/    /'
    done
else
    cuda_tests  # before the check, which then has the GPU alone
fi
echo "session: members done at $(at) s"

# ---------------------------------------------------------------- c. gpu-check on the idle GPU
BUDGET=$(( $(left) - 20 ))  # with no member to run, the check has the whole session
[ "$N" -gt 0 ] && [ "$BUDGET" -gt $((CHECK_S - 20)) ] && BUDGET=$((CHECK_S - 20))
echo "session: gpu-check with $BUDGET s"
timeout -k 15 "$BUDGET" "$PY" benchmarks/gpu_check.py "${CHECK[@]}" --out "$OUT/gpu-check.json" 2>&1 | grep -v "^USDT:"
echo "session: gpu-check ended at $(at) s (exit ${PIPESTATUS[0]}; 124: cut at its share, the rows done are in the file)"

[ -f /tmp/cuda-tests.txt ] && { echo "session: the CUDA-only unit tests:"; tail -n 15 /tmp/cuda-tests.txt; }

# ---------------------------------------------------------------- d. what comes back
if [ "$N" -gt 0 ]; then
    (cd "$RUNS" && for d in "${DIRS[@]}"; do
        r=${d#"$RUNS"/}
        ls -d "$r/benchmark_metrics.json" "$r/config.yaml" "$r/logs" "$r.log" 2> /dev/null
    done) > "$WORK/small.txt"
    tar -czf "$OUT/members.tgz" -C "$RUNS" -T "$WORK/small.txt" && echo "session: members.tgz: $(wc -l < "$WORK/small.txt") paths"
    if [ "$CKPT" = "1" ]; then  # the stopped members' state, to carry into the next session
        (cd "$RUNS" && for d in "${DIRS[@]}"; do
            r=${d#"$RUNS"/}
            if [ -f "$r/checkpoints/latest.pt" ] && ! grep -q '"finished": true' "$r/benchmark_metrics.json" 2> /dev/null; then
                ls -d "$r/benchmark_metrics.json" "$r/config.yaml" "$r/logs" "$r/checkpoints/latest.pt" 2> /dev/null
            fi
        done) > "$WORK/ckpt.txt"
        if [ -s "$WORK/ckpt.txt" ]; then
            tar -cf "$WORK/ckpt.tar" -C "$RUNS" -T "$WORK/ckpt.txt"
            used=$(du -cb "$OUT"/* | tail -1 | cut -f1); files=$(ls "$OUT" | wc -l); size=$(stat -c %s "$WORK/ckpt.tar")
            parts=$(( (size + 15728639) / 15728640 ))
            if [ $((files + parts)) -le 8 ] && [ $((used + size)) -le $((60 * 1048576)) ]; then
                split -b 15M -d "$WORK/ckpt.tar" "$OUT/ckpt.tar."
                echo "session: checkpoints of $(grep -c latest.pt "$WORK/ckpt.txt") stopped member(s): $parts part(s), $((size / 1048576)) MiB (carry them as $CARRIED/ckpt.tar.* next time)"
            else
                echo "session: checkpoints left out: $((size / 1048576)) MiB in $parts part(s) would not fit beside $files file(s) of $((used / 1048576)) MiB"
            fi
        fi
    fi
fi
echo "session: done at $(at) s; \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}

session 2>&1 | tee "$OUT/session.log"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
if [ -n "$DRY" ] && [ -z "${GPU_SESSION_ROOT:-}" ]; then rm -rf "$(dirname "$RUNS")"; fi  # the dry run's own root
exit "$rc"
