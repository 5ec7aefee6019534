#!/usr/bin/env bash
# One lent GPU machine, one call: what a sitting with an H100 (16 cores, no network) runs.
#   1. installs the wheels carried in .devwheels/ (procgen, gym3, Open MPI, mpi4py for its Python:
#      make them with `make devwheels`) into the machine's Python, which holds torch with CUDA;
#   2. the parity runs in bf16 and the open fp32 ones, side by side on the one GPU, each pinned to
#      its share of the cores, stopped gracefully in time for
#   3. make gpu-check (every CUDA path, timed) with a shorter PPO budget;
#   4. results into $OUT: the gpu-check JSON, the parity report and the finished runs' curves.
# GPU_SESSION_LIMIT (seconds, default 560) bounds the whole; GPU_SESSION_DRY=1 runs the same steps
# on the CPU with tiny budgets (to try the script before spending device time).
set -u
T0=$SECONDS
LIMIT=${GPU_SESSION_LIMIT:-560}
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
left() { echo $((LIMIT - (SECONDS - T0))); }

if [ -z "${GPU_SESSION_DRY:-}" ]; then
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
"$PY" -c "import torch, numpy, procgen, mpi4py; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__)" || exit 1

# 2. parity: three queues on disjoint cores, all on the one GPU
if [ -z "${GPU_SESSION_DRY:-}" ]; then CHECK=(--ppo-iterations 4); DEV=cuda; else CHECK=(--dry-run); DEV=cpu; fi
STOP=$(( $(left) - 200 ))   # 200 s: the stop itself and gpu-check after
PARITY=(benchmarks/parity.py --ranks 1 --out runs/parity --set training.device=$DEV --stop-after "$STOP")
N=$(nproc); Q=$((N / 4))
taskset -c 0-$((2 * Q - 1)) "$PY" "${PARITY[@]}" --precision bf16 --parallel 4 > "$OUT/parity-bf16.txt" 2>&1 &
taskset -c $((2 * Q))-$((3 * Q - 1)) "$PY" "${PARITY[@]}" --games starpilot --seeds 2 > "$OUT/parity-fp32.txt" 2>&1 &
taskset -c $((3 * Q))-$((N - 1)) "$PY" "${PARITY[@]}" --games coinrun --seeds 1 2 --tag old --parallel 2 \
    --set training.adv_norm=rollout --set training.reward_norm=rollout > "$OUT/parity-old.txt" 2>&1 &
wait
tail -n 4 runs/parity/*.log
cat "$OUT"/parity-*.txt | grep -v "^figure"

# 3. gpu-check: 4 timed PPO updates per row instead of 12 (the call's time is shared)
timeout "$(( $(left) - 15 ))" "$PY" benchmarks/gpu_check.py "${CHECK[@]}" --out "$OUT/gpu-check.json" 2>&1 | tail -25
echo "gpu-check done at $((SECONDS - T0)) s"

# 4. what comes back: the report and kept runs (small files), the logs of every run
"$PY" analysis/parity.py analysis/data/parity/runs/* > /dev/null 2>&1
tar czf "$OUT/parity.tgz" analysis/data/parity runs/parity/*.log
echo "session done at $((SECONDS - T0)) s"
