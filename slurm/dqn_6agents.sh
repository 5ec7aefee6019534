#!/bin/bash
# =============================================================================================
# mpippo: SIX independent DQN agents on one 48-core / 6-GPU node: 6 x (1 learner + 7 actors).
#
#   sbatch slurm/dqn_6agents.sh                                # configs/dqn_procgen.yaml
#   sbatch slurm/dqn_6agents.sh --set env.name=bigfish --total-timesteps 60000000
#
# COMM_WORLD is split into 6 groups of 8 consecutive ranks (dqn.num_agents=6); agent k's learner
# is rank 8k and uses GPU k (CUDA_VISIBLE_DEVICES from --gpus-per-node=6), its 7 actors run on
# CPU cores. Each agent writes runs/slurm-<job id>/agent_<k>/. Agents share nothing but the job:
# use it for seeds or hyperparameter variants at one submission. --total-timesteps is over ALL
# agents' actors (each agent gets a sixth).
# Run it from the repository root. For your site, edit the --partition / --account lines and the
# ENVIRONMENT block in slurm/common.sh. Options after the script name go to run_mpi.py.
# =============================================================================================
#SBATCH --job-name=mpippo-dqn6
#SBATCH --nodes=1
#SBATCH --ntasks=48
#SBATCH --cpus-per-task=1
#SBATCH --gpus-per-node=6
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
##SBATCH --partition=YOUR_PARTITION
##SBATCH --account=YOUR_ACCOUNT

COMMON="${MPIPPO_ROOT:-${SLURM_SUBMIT_DIR:-.}}/slurm/common.sh"  # (sbatch runs a copy of this script: not from here)
[ -f "$COMMON" ] || { echo "mpippo: error: no $COMMON: submit from the repository's root, or set MPIPPO_ROOT" >&2; exit 2; }
source "$COMMON" --config configs/dqn_procgen.yaml --set dqn.num_agents=6 "$@"
