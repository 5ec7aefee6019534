#!/bin/bash
# =============================================================================================
# mpippo: asynchronous PPO (APPO, V-trace) on ONE node with 48 cores and GPUs.
#
#   sbatch slurm/appo_6gpu.sh                                  # 1 GPU learner + 47 CPU actors
#   sbatch slurm/appo_6gpu.sh --set env.name=bigfish --total-timesteps 50000000
#   sbatch --gpus-per-node=6 slurm/appo_6gpu.sh --set appo.num_agents=6
#                                                              # 6 agents x (1 learner + 7 actors)
#
# Layout: rank 0 learns on one GPU (V-trace targets, PPO's clipped loss); ranks 1-47 step their
# envs on CPU cores with the newest weights they have and never wait for learning, only for
# credit. With appo.num_agents=6, COMM_WORLD is split into 6 groups of 8 consecutive ranks:
# agent k's learner is rank 8k on GPU k, and it writes runs/slurm-<job id>/agent_<k>/ (seeds or
# variants at one submission; --total-timesteps is over all agents). Which layout to pick, and
# when APPO beats the synchronous PPO of slurm/ppo_6gpu.sh: docs/algorithms.md, "Which algorithm?".
# Run it from the repository root. For your site, edit the --partition / --account lines and the
# ENVIRONMENT block in slurm/common.sh. Options after the script name go to run_mpi.py.
# On a node whose CUDA is not usable the learner falls back to the CPU with one warning.
# =============================================================================================
#SBATCH --job-name=mpippo-appo
#SBATCH --nodes=1
#SBATCH --ntasks=48
#SBATCH --cpus-per-task=1
#SBATCH --gpus-per-node=1
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
##SBATCH --partition=YOUR_PARTITION
##SBATCH --account=YOUR_ACCOUNT

COMMON="${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"  # (sbatch runs a copy of this script: not from here)
[ -f "$COMMON" ] || { echo "mpippo: error: no $COMMON: submit from the repository's root, or set MPIPPO_ROOT" >&2; exit 2; }
source "$COMMON" --config configs/appo_procgen.yaml "$@"
