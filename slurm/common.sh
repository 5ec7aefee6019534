# Shared body of mpippo's batch scripts; sourced by slurm/*.sh after their #SBATCH header.
# Everything here adapts to the allocation; site edits belong in the ENVIRONMENT block below
# or in the environment variables it reads.
#
#   MPIPPO_ROOT      the repository (default: the directory sbatch was run from)
#   MPIPPO_PYTHON    python with mpippo's dependencies (default: $MPIPPO_ROOT/.venv/bin/python)
#   MPIPPO_LAUNCHER  mpirun (default) or srun (PMIx)
#   MPIPPO_RUN_DIR   run folder (default: $MPIPPO_ROOT/runs/slurm-<job id>, so a requeued job finds its run)
#   MPIPPO_MPIRUN_ARGS  extra mpirun options, split at spaces (e.g. "--bind-to none"; quotes are refused)
#   MPIPPO_SRUN_MPI  srun's --mpi plugin (unset: pmix; a name of letters, digits, underscores; empty is refused)
set -uo pipefail

# Signals first, before anything else runs: Slurm sends --signal=B:USR1@T to this shell (and,
# with preempt_send_user_signal, at preemption); without a trap bash would die of it. It is
# passed on to the trainer, which checkpoints at the end of its iteration and exits 3. SIGTERM
# is relayed as SIGUSR2 ("checkpoint and stop"): mpirun would kill the ranks on a TERM. A signal
# that comes before every rank catches signals is held: a rank whose interpreter has not yet run
# its first line would die of it. Rank 0 creates $MPIPPO_LISTENING at start-up's first agreement
# (every rank has installed its handlers by then); a held signal goes on the moment it appears,
# or after LISTEN_MAX_S if it never does (a trainer that ends first is past needing it).
# (a script that sourced this file may have kept signals from before: suite_member.sh)
PID="" PENDING=() LISTEN_MAX_S=60
FORWARDED=" "  # the kinds passed on (or held to be): each once, see forward()
for s in ${MPIPPO_EARLY_SIGNALS[@]+"${MPIPPO_EARLY_SIGNALS[@]}"}; do  # (only these: a variable of that name
    case "$s:$FORWARDED" in                                            # in the user's environment is no list of ours)
      USR1:*" USR1 "*|USR2:*" USR2 "*) ;;
      USR1:*|USR2:*) PENDING+=("$s"); FORWARDED+="$s " ;;
    esac
done
# Named as mpippo/leftovers.py names what a process makes for itself (mpippo-<what>-<boot>.<pid namespace>.<pid>-,
# leftovers.owner: whose pids the pid is, on a TMPDIR other nodes may share): a batch shell killed before
# its end leaves the mark, and the next job here (below), launcher or tool removes it once that shell is gone.
BOOT=$(head -c 8 /proc/sys/kernel/random/boot_id 2>/dev/null)
[[ $BOOT =~ ^[0-9a-f]{8}$ ]] || BOOT=00000000
OWNER="$BOOT.$(stat -L -c %i /proc/self/ns/pid 2>/dev/null || echo 0)"
export MPIPPO_LISTENING="${TMPDIR:-/tmp}/mpippo-listening-$OWNER.$$-job${SLURM_JOB_ID:-0}"
rm -f "$MPIPPO_LISTENING"
MARK_BASE=$MPIPPO_LISTENING
while [ -e "$MPIPPO_LISTENING" ] || [ -L "$MPIPPO_LISTENING" ]; do  # what rm -f leaves (a folder): another name,
    MPIPPO_LISTENING="$MARK_BASE.n$RANDOM"                          # or the mark would read as made at once
done
send_when_listening() {
    ( for _ in $(seq $((LISTEN_MAX_S * 5))); do
          [ -e "$MPIPPO_LISTENING" ] && break
          kill -0 "$PID" 2>/dev/null || exit 0
          sleep 0.2
      done
      kill "-$1" "$PID" 2>/dev/null ) &
}
# Each kind is passed on once: the trainer is already stopping after the first, and a repeat that
# lands while its ranks exit (a retried scancel, a second preemption notice) would kill a rank
# whose interpreter has already dropped its handlers, losing the requeue.
forward() {
    case "$FORWARDED" in *" $1 "*) echo "mpippo: $1 again: already passed on, ignored"; return ;; esac
    FORWARDED+="$1 "
    if [ -z "$PID" ]; then PENDING+=("$1")
    elif [ -e "$MPIPPO_LISTENING" ]; then kill "-$1" "$PID" 2>/dev/null
    else send_when_listening "$1"; fi
}
trap 'echo "mpippo: USR1 received, asking the trainer to checkpoint"; forward USR1' USR1
trap 'echo "mpippo: TERM received, asking the trainer to checkpoint and stop"; forward USR2' TERM

# A value as an error line shows it: line breaks written \n, so that the error stays one line
one_line() { local v=${1//$'\n'/\\n}; v=${v//$'\r'/\\r}; printf '%s' "$v"; }

if [ -z "${SLURM_JOB_ID:-}" ]; then  # (one line, not bash's "unbound variable")
    echo "mpippo: error: $(basename "$0") is a batch script: submit it with sbatch (no Slurm job here)" >&2; exit 2
elif [ -z "${SLURM_NTASKS:-}" ]; then
    echo "mpippo: error: job $SLURM_JOB_ID has no task count (SLURM_NTASKS): submit it with --ntasks or" \
         "--ntasks-per-node, as the script's #SBATCH lines do" >&2; exit 2
fi
MPIPPO_ROOT=${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
cd "$MPIPPO_ROOT" || { echo "mpippo: error: cannot cd to MPIPPO_ROOT=$(one_line "$MPIPPO_ROOT")" >&2; exit 2; }
MPIPPO_ROOT=$PWD  # (a relative one would be resolved twice below, from inside it)

# ---- ENVIRONMENT: edit for your site -------------------------------------------------------
# module load openmpi            # a site MPI, if mpi4py was built against it
# source activate mpippo         # the conda env from environment.yml
MPIPPO_PYTHON=${MPIPPO_PYTHON:-$MPIPPO_ROOT/.venv/bin/python}
# ---------------------------------------------------------------------------------------------
if ! [ -x "$MPIPPO_PYTHON" ] && ! command -v "$MPIPPO_PYTHON" >/dev/null 2>&1; then
    echo "mpippo: error: MPIPPO_PYTHON='$(one_line "$MPIPPO_PYTHON")' is not a program this node can run; set it to the python" \
         "of mpippo's environment (default: .venv/bin/python in MPIPPO_ROOT, made by make venv)" >&2; exit 2
fi

# Open MPI makes its session folder in TMPDIR (or TEMP, TMP): where it cannot (a file there, a folder no one
# may write in), mpirun ends in a box of its text and status 213 before any rank starts; said in one line here
"$MPIPPO_PYTHON" -c 'import sys; from mpippo.leftovers import temp_folder_problem as p; sys.exit((b := p()) and "mpippo: error: " + b)' || exit 2

export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
THREADS=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
RUN_DIR=${MPIPPO_RUN_DIR:-$MPIPPO_ROOT/runs/slurm-${SLURM_JOB_ID:?not inside a Slurm job}}
LAUNCHER=${MPIPPO_LAUNCHER:-mpirun}
RESTARTS=${SLURM_RESTART_COUNT:-0}
case $RESTARTS in ''|*[!0-9]*) RESTARTS=0 ;; esac
for a in "$@"; do  # the run folder is the script's, so that a requeued job finds its checkpoint there
    # (--output-dir or any prefix of it the trainer's parser takes: no other option starts with --o)
    if [[ ${a%%=*} == --o* && --output-dir == "${a%%=*}"* ]]; then
        echo "mpippo: error: $(one_line "$a"): the batch scripts choose the run folder (here $(one_line "$RUN_DIR")), so that a requeued" \
             "job finds its checkpoint; set MPIPPO_RUN_DIR instead" >&2; exit 2
    fi
done

# The guard against launch mistakes (srun without --mpi=pmix starts N one-rank jobs) is this
# allocation's task count, on a fresh start and on a requeue alike: a requeued job granted fewer or
# more nodes of its --nodes range resumes on the ranks it got (the trainer re-shards the envs).
ARGS=(--output-dir "$RUN_DIR" --no-progress
      --set "parallel.threads_per_rank=$THREADS"
      --set "parallel.expected_world_size=$SLURM_NTASKS")
if [ -f "$RUN_DIR/checkpoints/latest.pt" ] || [ -f "$RUN_DIR/agent_0/checkpoints/latest.pt" ]; then
    ARGS+=(--resume)  # a requeued or restarted job continues its own run
elif [ "$RESTARTS" -gt 0 ]; then  # requeued before its first checkpoint: what it wrote is set aside, kept
    "$MPIPPO_PYTHON" - "$RUN_DIR" <<'PY' || exit 2
import sys
from mpippo import runlock
from mpippo.errors import os_reason
try:
    aside = runlock.set_aside(sys.argv[1], "MPIPPO_RUN_DIR")
except runlock.FolderBusy as e:  # another job trains there: never moved
    sys.exit(f"mpippo: error: {e.errors[0]}")
except OSError as e:  # (a folder it may not rename: the trainer would refuse it anyway)
    sys.exit(f"mpippo: error: MPIPPO_RUN_DIR: cannot set {sys.argv[1]!r} aside ({os_reason(e)})")
if aside:
    print(f"mpippo: no checkpoint to resume in {sys.argv[1]}: set aside as {aside.name}; starting afresh")
PY
fi

# Placement under mpirun: each task bound to its --cpus-per-task cores (Open MPI binds each of 1-2
# ranks to ONE core by default, whatever the allocation: a GPU rank would step its envs on one core).
# Unbound when this node has fewer real cores than its tasks claim, or when MPIPPO_MPIRUN_ARGS or the
# environment chooses a binding. srun places tasks by --cpus-per-task itself.
TASKS_HERE=${SLURM_TASKS_PER_NODE%%[(,]*}
BIND=(--map-by "slot:PE=$THREADS")
if [ "$(nproc)" -lt $(( ${TASKS_HERE:-1} * THREADS )) ]; then BIND=(--bind-to none); fi
# (the options and variables mpippo/launch.py leaves a user's binding to: BINDING_OPTIONS, BINDING_ENV)
case " ${MPIPPO_MPIRUN_ARGS:-} " in
  *" --map-by"*|*" --bind-to"*|*" --rankfile"*|*" --cpu-set"*|*" --cpus-per-rank"*|*" -map-by"*|*" -bind-to"*) BIND=() ;;
esac
if [ -n "${PRTE_MCA_hwloc_default_binding_policy:-}${OMPI_MCA_hwloc_base_binding_policy:-}" ]; then BIND=(); fi

case "$LAUNCHER" in
  mpirun)
    MPIRUN=${MPIPPO_MPIRUN:-$(dirname "$MPIPPO_PYTHON")/mpirun}
    [ -x "$MPIRUN" ] || MPIRUN=mpirun
    # split at spaces as the variable's documentation says, never globbed against the repository's files;
    # a quote or backslash would reach mpirun as a character of an option (no shell reads it again)
    case "${MPIPPO_MPIRUN_ARGS:-}" in
      *[\"\'\\]*)
        echo "mpippo: error: MPIPPO_MPIRUN_ARGS='$(one_line "$MPIPPO_MPIRUN_ARGS")' holds a quote or backslash; it is split at" \
             "spaces only, never read as a shell would: give each option and value without quotes" >&2
        exit 2 ;;
    esac
    set -f
    # shellcheck disable=SC2086
    CMD=("$MPIRUN" ${MPIPPO_MPIRUN_ARGS:-} ${BIND[@]+"${BIND[@]}"} -n "$SLURM_NTASKS" "$MPIPPO_PYTHON" run_mpi.py)
    set +f ;;
  srun)  # (its tasks' CPUs given: srun takes no --cpus-per-task from sbatch since Slurm 22.05)
    case "${MPIPPO_SRUN_MPI-pmix}" in
      ""|*[!A-Za-z0-9_]*)
        echo "mpippo: error: MPIPPO_SRUN_MPI='$(one_line "$MPIPPO_SRUN_MPI")' is not an MPI plugin's name (letters, digits and" \
             "underscores, e.g. pmix, pmix_v4, pmi2: srun --mpi=list names this cluster's)" >&2
        exit 2 ;;
    esac
    CMD=(srun "--mpi=${MPIPPO_SRUN_MPI-pmix}" --kill-on-bad-exit=1 "--cpus-per-task=$THREADS" "$MPIPPO_PYTHON" \
         run_mpi.py) ;;
  *)
    echo "mpippo: error: MPIPPO_LAUNCHER='$(one_line "$LAUNCHER")' is not one of mpirun, srun" >&2; exit 2 ;;
esac

# Open MPI names its shared-memory files after a 16-bit hash of the job's id, so two jobs sharing a
# node meet on the same files about once in 65,536 pairs (mpippo/launch.py, own_shm_folder): a
# one-node job gets a folder of its own, removed at the end. On several nodes (the folder would have to
# exist on every node) each rank makes its own (mpippo/leftovers.py, own_rank_shm_folder); a folder
# the environment names is kept.
# Named as mpippo/leftovers.py names its own (mpippo-sm-<boot>.<pid namespace>.<pid>-...): a job killed with no
# chance to remove it (kill -9, a node reboot spares /dev/shm only by accident) leaves a folder that
# the next job here, or the next launcher or tool, removes once that batch shell is gone.
# (a node whose boot id cannot be read sweeps /dev/shm only: its TMPDIR may hold other nodes' marks; one whose pid
# namespace cannot be read sweeps nothing, as mpippo/leftovers.py: a container's pid is not judged from another's)
MARKS=("${TMPDIR:-/tmp}"/mpippo-listening-"$OWNER".*-*)
[ "$BOOT" = 00000000 ] && MARKS=()
SWEPT=(/dev/shm/mpippo-*-"$OWNER".*-*)
case "$OWNER" in *.0) SWEPT=(); MARKS=() ;; esac
for d in ${SWEPT[@]+"${SWEPT[@]}"} ${MARKS[@]+"${MARKS[@]}"}; do
    [ -d "$d" ] || [ -f "$d" ] || continue
    [ ! -L "$d" ] && [ -O "$d" ] || continue
    pid=${d##*/mpippo-*-"$OWNER".}; pid=${pid%%-*}
    case "$pid" in ''|*[!0-9]*) continue ;; esac
    kill -0 "$pid" 2>/dev/null || rm -rf "$d"
done
SHM_DIR=""
if [ -z "${OMPI_MCA_btl_sm_backing_directory:-}${OMPI_MCA_btl_vader_backing_directory:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" = 1 ] \
   && SHM_DIR=$(mktemp -d "/dev/shm/mpippo-sm-$OWNER.$$-job${SLURM_JOB_ID}.XXXXXX" 2>/dev/null); then
    export OMPI_MCA_btl_sm_backing_directory=$SHM_DIR
fi

echo "mpippo: job $SLURM_JOB_ID restart $RESTARTS on $SLURM_JOB_NODELIST: $SLURM_NTASKS tasks x $THREADS cpu, launcher $LAUNCHER${BIND[*]:+ (${BIND[*]})}, run $RUN_DIR${SHM_DIR:+, shared memory in $SHM_DIR}"

# What rank 0 wrote in its mark: "running" while it trained, then "exit <its status>" (mpippo/preemption.py);
# nothing where it could not say (no mark: rank 0 on another node, a full TMPDIR). A status 3 that is not
# rank 0's own came from code that ended a rank with it (a user's env calling os._exit(3)): requeued, the
# job would end so again, forever.
rank0_said() {
    [ -f "$MPIPPO_LISTENING" ] && [ ! -L "$MPIPPO_LISTENING" ] || return 0  # (never a FIFO's blocking read)
    head -c 16 "$MPIPPO_LISTENING" 2>/dev/null | tr -dc 'a-z0-9 '
}
# The status of a child of this shell: `wait` returns early when a trapped signal arrives, so wait on
# until the child itself has ended (then once more: a trap's return as it ended, bash keeps its status).
status_of() {
    local st again
    while true; do
        wait "$1"; st=$?
        kill -0 "$1" 2>/dev/null || break
    done
    if [ "$st" -gt 128 ]; then
        wait "$1" 2>/dev/null; again=$?
        [ "$again" -eq 127 ] || st=$again
    fi
    return "$st"
}
launch() {
    "${CMD[@]}" "${ARGS[@]}" "$@" &
    PID=$!
    for sig in ${PENDING[@]+"${PENDING[@]}"}; do send_when_listening "$sig"; done  # (bash < 4.4: an empty "${A[@]}" is unbound)
    # An mpirun that outlives every rank it started here (Open MPI's runtime can wait forever after a rank
    # failed at its start) is ended 30 s after, as the launcher ends it (mpippo/launch.py, _Outlived);
    # else the job waited for its time limit. (srun's tasks are not its children here: not watched.)
    local watch=""
    if [ "$LAUNCHER" = mpirun ]; then
        "$MPIPPO_PYTHON" -c 'import sys; from mpippo.launch import watch_batch_mpirun as w; sys.exit(w(int(sys.argv[1])))' \
            "$PID" &
        watch=$!
    fi
    status_of "$PID"; RC=$?
    [ -n "$watch" ] || return 0
    status_of "$watch"
    if [ $? -eq 9 ]; then  # (mpippo.launch.WATCH_ENDED: it ended mpirun, and said so): rank 0's own status if it said one
        local said; said=$(rank0_said)
        case "$said" in "exit "[0-9]*) RC=${said#exit } ;; *) RC=1 ;; esac
    fi
}
# What the run folder holds, names, sizes and times: a launch that changed nothing in it wrote nothing.
folder_state() { find "$RUN_DIR" -maxdepth 3 -printf '%p %s %T@\n' 2>/dev/null | sort | cksum; }
BEFORE=$(folder_state)
launch "$@"
# A launcher that failed before any rank listened (no mark: rank 0 makes it once every rank runs
# mpippo; Open MPI's "PMIx server's listener thread failed to start", about one launch in 900 on a
# loaded node) trained nothing: it is started once more, unless the status is the trainer's own (0,
# or 2-4: bad input, a checkpoint after a signal) or the run folder changed (the mark is best effort:
# a full TMPDIR, or one on another node, leaves none after hours of training). No rank heard the
# signals that came meanwhile (none listened): they are held for the second launch, as before the first.
case $RC in
  0|2|3|4) ;;
  *) if [ ! -e "$MPIPPO_LISTENING" ] && [ "$(folder_state)" = "$BEFORE" ]; then
         PID=""  # (a signal from now on is held, not sent to the ended launch)
         echo "mpippo: the launch failed before every rank ran mpippo (status $RC); starting it once more"
         sleep 2
         read -ra PENDING <<< "$FORWARDED"  # (every kind this job was asked to pass on, each once)
         launch "$@"
     fi ;;
esac
# Open MPI's runtime that failed in its own words under `ulimit -f`, or a low open-file limit: its box names no
# limit, so a line does, the launcher's (mpippo.launch.limits_note); a python that fails here adds nothing
if [ "$LAUNCHER" = mpirun ] && [ "$RC" -ne 0 ]; then
    "$MPIPPO_PYTHON" -c 'import sys; from mpippo.launch import limits_note as n
(w := n(int(sys.argv[1]))) and print(w)' "$RC" 2>/dev/null || true
fi

# Slurm answers a requeue by sending TERM to every process of this allocation, scontrol included:
# one still running when it lands dies of it (under load it often is), and its requeue or update
# reads as failed though it took effect. These two run with TERM ignored.
unkillable_scontrol() { ( trap '' TERM; exec scontrol "$@" ); }

# A job whose task count follows its nodes (--ntasks-per-node: nodes granted x tasks per node) and
# that requeues itself: Slurm keeps the first grant's task count in the job, so the requeued job would
# wait for as many nodes as it had (a --nodes=2-4 job that got 4 would never start on 3). One
# node's worth resets it: the next grant, anywhere in the range, sets the count again. (Only a
# pending job takes the update, and the requeue may not have made it pending yet: a few tries.)
reopen_node_range() {
    local per_node=${SLURM_NTASKS_PER_NODE:-}
    case "$per_node" in ''|*[!0-9]*) return ;; esac
    [ "$SLURM_NTASKS" -eq $(( ${SLURM_JOB_NUM_NODES:-1} * per_node )) ] || return
    for _ in 1 2 3 4 5; do
        unkillable_scontrol update "JobId=$SLURM_JOB_ID" "NumTasks=$per_node" 2>/dev/null && return
        sleep 1
    done
    echo "mpippo: could not reset the task count; the requeued job waits for $SLURM_JOB_NUM_NODES node(s)"
}

SAID=$(rank0_said)
[ "$RC" = 3 ] && [ -n "$SAID" ] && [ "$SAID" != "exit 3" ] && RC=-3
case $RC in
  0) echo "mpippo: finished" ;;
  2) echo "mpippo: bad input (see the error line above); not requeued" ;;
  -3) RC=3
     case "$SAID" in running) SAID="rank 0 was still training" ;; *) SAID="rank 0 ended with status ${SAID#exit }" ;; esac
     echo "mpippo: trainer exited with status 3 but not after a checkpoint of its own ($SAID): code other" \
          "than mpippo's ended a rank with that status (an env calling os._exit(3)?); not requeued" ;;
  3) echo "mpippo: checkpointed after USR1; requeueing job $SLURM_JOB_ID"
     if unkillable_scontrol requeue "$SLURM_JOB_ID"; then RC=0; reopen_node_range
     else echo "mpippo: scontrol requeue failed (already requeued by a preemption?); to go on, submit again with" \
               "MPIPPO_RUN_DIR=$RUN_DIR"; fi ;;
  4) echo "mpippo: checkpointed and stopped after a stop signal (TERM, INT, HUP, USR2; XCPU: a CPU-time limit)" ;;
  *) echo "mpippo: trainer exited with status $RC" ;;
esac
rm -f "$MPIPPO_LISTENING"
[ -n "$SHM_DIR" ] && rm -rf "$SHM_DIR"
exit $RC
