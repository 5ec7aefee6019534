#!/bin/bash
# =============================================================================================
# mpippo: synchronous PPO over SEVERAL nodes (default 2 x 48 ranks). Same script body as
# ppo_48core.sh; the ranks of all nodes form one MPI world and one Allreduce per minibatch
# spans the interconnect (2.5 MB per call for the default network).
#
#   sbatch slurm/ppo_multinode.sh --num-envs-per-rank 2 --total-timesteps 100000000
#   sbatch --nodes=4 slurm/ppo_multinode.sh ...                 # more nodes: options override #SBATCH
#
# Run it from the repository root. For your site, edit the --partition / --account lines and the
# ENVIRONMENT block in slurm/common.sh. Over TCP-only networks pip's Open MPI may need
#   MPIPPO_MPIRUN_ARGS="--mca pml ob1 --mca btl self,tcp"
# Preemption-safe like ppo_48core.sh (USR1 -> checkpoint -> requeue -> exact resume).
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

source "${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" "$@"
