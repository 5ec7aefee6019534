#!/usr/bin/env bash
# A real Slurm on this machine, for tests: `tests/slurm/local_cluster.sh start|stop|status`.
#
# start: installs Debian's slurmctld/slurmd/munge (as root, once), writes a config under
#        $MPIPPO_SLURM_DIR (default /tmp/mpippo-slurm), starts munged, slurmctld and three slurmd:
#          node "big"   claims 48 CPUs and 6 GPUs (character devices standing in for GPUs),
#          nodes n1,n2  claim 4 CPUs each: two emulated nodes for multi-node jobs.
#        Partitions: batch (default, big), urgent (big, higher priority: preempts batch jobs,
#        which are requeued after a USR1), multi (n1,n2).
# stop:  stops the daemons by PID (no systemd needed).
# Slurm lets a node claim more CPUs than it has (SlurmdParameters=config_overrides), so the
# 48-task layouts can be submitted on a small machine; the tasks then share the real cores.
set -euo pipefail

DIR=${MPIPPO_SLURM_DIR:-/tmp/mpippo-slurm}
HOST=$(hostname -s)
ETC=/etc/slurm
PMIX_LIB=/usr/lib/x86_64-linux-gnu/pmix2/lib

log() { echo "local_cluster: $*" >&2; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
            && [ -e "$PMIX_LIB/libpmix.so.2" ]; then
        return
    fi
    log "installing slurm-wlm and munge from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # libpmix2 first: the daemons' pmix plugin must find it when they start
    apt-get install -y -qq --no-install-recommends libpmix2 >/dev/null
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

write_config() {
    mkdir -p "$DIR"/{state,log,run,tmp,dev} "$DIR"/spool/{big,n1,n2} "$ETC"
    # the pmix plugin dlopens libpmix.so, which Debian only ships as libpmix.so.2
    [ -e "$PMIX_LIB/libpmix.so" ] || ln -sf libpmix.so.2 "$PMIX_LIB/libpmix.so"
    # fake GPUs: slurmd wants character devices in gres.conf (regular files are rejected)
    for i in 0 1 2 3 4 5; do
        [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
    done
    local mem
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat > "$ETC/slurm.conf" <<EOF
ClusterName=mpippo
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
SlurmctldPort=16817
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
SchedulerParameters=bf_interval=2,sched_interval=2
MinJobAge=600
KillWait=30
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
NodeName=big NodeHostname=$HOST Port=17000 CPUs=48 RealMemory=$mem Gres=gpu:6 TmpDisk=0 State=UNKNOWN
NodeName=n1 NodeHostname=$HOST Port=17001 CPUs=4 RealMemory=$((mem / 4)) State=UNKNOWN
NodeName=n2 NodeHostname=$HOST Port=17002 CPUs=4 RealMemory=$((mem / 4)) State=UNKNOWN
PartitionName=batch Nodes=big Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=120
PartitionName=urgent Nodes=big MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
PartitionName=multi Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=1
EOF
    cat > "$ETC/gres.conf" <<EOF
AutoDetect=off
NodeName=big Name=gpu File=$DIR/dev/nvidia[0-5]
EOF
    # pip's Open MPI has no munge security component: let PMIx use its native one
    echo "PMIxEnv=PMIX_MCA_psec=native" > "$ETC/mpi.conf"
    rm -f "$ETC/cgroup.conf"
}

start_munge() {
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if ! pgrep -x munged >/dev/null; then
        runuser -u munge -- /usr/sbin/munged
    fi
}

start() {
    install_packages
    stop quiet
    write_config
    start_munge
    slurmctld -c -i  # -c: clean state (no jobs from an earlier cluster)
    for node in big n1 n2; do
        slurmd -N "$node"
    done
    for _ in $(seq 60); do
        if sinfo -h -o '%T' 2>/dev/null | grep -qv -E 'down|unk|not_resp'; then
            if [ "$(sinfo -h -N -o '%T' | grep -c -E '^idle')" -ge 3 ]; then
                log "up: $(sinfo -h -N -o '%N:%T:%c' | tr '\n' ' ')"
                return 0
            fi
        fi
        sleep 1
    done
    log "nodes did not come up; see $DIR/log"
    sinfo -N >&2 || true
    tail -20 "$DIR"/log/*.log >&2 || true
    return 1
}

stop() {
    local pidfile pid
    for pidfile in "$DIR"/run/slurmd.*.pid "$DIR"/run/slurmctld.pid; do
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
    [ "${1:-}" = quiet ] || log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) sinfo -N; squeue ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
