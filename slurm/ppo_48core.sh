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
# The default config splits 64 envs over the ranks; 48 ranks need --num-envs-per-rank (e.g. 2)
# or --num-envs 96 so that every rank gets the same share.
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

source "${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh" "$@"
