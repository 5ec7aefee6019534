#!/bin/bash
# =============================================================================================
# mpippo: synchronous PPO over SEVERAL nodes (default 2 x 48 ranks). Same script body as
# ppo_48core.sh; the ranks of all nodes form one MPI world and one Allreduce per minibatch
# spans the interconnect (2.5 MB per call for the default network).
#
#   sbatch slurm/ppo_multinode.sh --num-envs-per-rank 2 --total-timesteps 100000000
#   sbatch --nodes=4 slurm/ppo_multinode.sh ...                 # more nodes: options override #SBATCH
#   sbatch --nodes=2-4 slurm/ppo_multinode.sh --config configs/ppo_procgen.yaml --set env.num_envs=576
#                                       # whatever 2 to 4 nodes are free, at start and at each requeue
#
# A node range: the job runs 48 ranks on each node it is granted (--ntasks follows the nodes), and
# a requeued job takes whatever the range gives it then; it resumes on that many ranks. With the
# total env count fixed (env.num_envs, passed again on every requeue; 576 divides over 96, 144 and
# 192 ranks) every env's state moves to its new rank and the episodes in progress go on; with
# --num-envs-per-rank the total changes with the ranks and the envs start fresh (docs/failures.md).
#
# Run it from the repository root. For your site, edit the --partition / --account lines and the
# ENVIRONMENT block in slurm/common.sh. Over TCP-only networks pip's Open MPI may need
#   MPIPPO_MPIRUN_ARGS="--mca pml ob1 --mca btl self,tcp"
# Preemption-safe like ppo_48core.sh (USR1 -> checkpoint -> requeue -> resume; exact on the same node count).
# =============================================================================================
#SBATCH --job-name=mpippo-ppo-multi
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=48
#SBATCH --cpus-per-task=1
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
##SBATCH --partition=YOUR_PARTITION
##SBATCH --account=YOUR_ACCOUNT

COMMON="${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"  # (sbatch runs a copy of this script: not from here)
[ -f "$COMMON" ] || { echo "mpippo: error: no $COMMON: submit from the repository's root, or set MPIPPO_ROOT" >&2; exit 2; }
source "$COMMON" "$@"
