#!/bin/bash
# =============================================================================================
# mpippo: synchronous PPO on ONE 48-core node: 48 MPI ranks x 1 CPU, one Allreduce per minibatch.
#
#   sbatch slurm/ppo_48core.sh                                  # default config, 25M steps
#   sbatch slurm/ppo_48core.sh --total-timesteps 50000000       # options go to run_mpi.py
#   MPIPPO_LAUNCHER=srun sbatch slurm/ppo_48core.sh             # srun (PMIx) instead of mpirun
#
# Run it from the repository root (the job cds to the submit directory). For your site, edit:
#   - the --partition / --account lines below (uncomment them),
#   - the ENVIRONMENT block in slurm/common.sh (module load / conda activate), or set MPIPPO_PYTHON.
# Preemption-safe: on USR1 (300 s before the time limit, or at preemption) the trainer checkpoints
# and the job requeues itself; the restarted job resumes runs/slurm-<job id> exactly.
# The default config's 64 envs do not divide over 48 ranks: they are rounded up to 2 per rank,
# 96 in all (the start-up line says so); --num-envs-per-rank N sets the share yourself.
# =============================================================================================
#SBATCH --job-name=mpippo-ppo48
#SBATCH --nodes=1
#SBATCH --ntasks=48
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
