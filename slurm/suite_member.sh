#!/bin/bash
# =============================================================================================
# mpippo: one member of a benchmark suite, as one element of the job array that
# `python -m mpippo.suite run SUITE` submits (it sets the array, tasks, CPUs, GPUs, time limit and
# output on the sbatch line from the suite file; do not sbatch this script by hand).
#
#   slurm/suite_member.sh MANIFEST      # element $SLURM_ARRAY_TASK_ID = member index in MANIFEST
#
# The member's folder and trainer options come from the manifest the submission wrote; the rest
# is slurm/common.sh: preemption-safe (USR1 before the limit or at preemption: checkpoint,
# requeue, resume), --resume when the folder holds a checkpoint. The member's console output goes
# to <folder>.log beside its folder (what `suite status` reads), Slurm's own to the suite's slurm/.
# =============================================================================================
#SBATCH --requeue
#SBATCH --open-mode=append
##SBATCH --partition=YOUR_PARTITION
##SBATCH --account=YOUR_ACCOUNT

# a signal before common.sh's traps (the manifest lookup runs first) is kept and passed on there
MPIPPO_EARLY_SIGNALS=()
trap 'MPIPPO_EARLY_SIGNALS+=(USR1)' USR1
trap 'MPIPPO_EARLY_SIGNALS+=(USR2)' TERM
if [ $# -lt 1 ] || [ -z "${SLURM_ARRAY_TASK_ID:-}" ]; then  # (one line, exit 2: bash's own :? says 1)
    echo "mpippo: error: suite_member.sh MANIFEST runs as an element of the job array that" \
         "'python -m mpippo.suite run SUITE' submits; do not run or sbatch it by hand" >&2; exit 2
fi
MANIFEST=$1
shift
ROOT=${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-.}}
PYTHON=${MPIPPO_PYTHON:-$ROOT/.venv/bin/python}
# the lookup says in one line why it cannot give the member (a damaged manifest, a member folder
# that another process writes now): its exit code ends the element, without a second line
LOOKUP=$(cd "$ROOT" && "$PYTHON" -m mpippo.suite member "$MANIFEST" "$SLURM_ARRAY_TASK_ID") \
    || exit $?
mapfile -t ENTRY <<< "$LOOKUP"
if [ "${#ENTRY[@]}" -lt 1 ] || [ -z "${ENTRY[0]}" ]; then
    echo "mpippo: error: suite member ${SLURM_ARRAY_TASK_ID} is not in $MANIFEST" >&2; exit 2
fi
export MPIPPO_RUN_DIR=${ENTRY[0]}
mkdir -p "$(dirname "$MPIPPO_RUN_DIR")"
exec >> "$MPIPPO_RUN_DIR.log" 2>&1
MEMBER_ARGS=("${ENTRY[@]:1}")
if [ -f "$MPIPPO_RUN_DIR/checkpoints/latest.pt" ]; then
    MEMBER_ARGS=()  # common.sh adds --resume: the run's own config.yaml says the rest
fi
source "$ROOT/slurm/common.sh" ${MEMBER_ARGS[@]+"${MEMBER_ARGS[@]}"} "$@"  # (bash < 4.4: an empty "${A[@]}" is unbound)
