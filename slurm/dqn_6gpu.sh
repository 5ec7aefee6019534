#!/bin/bash
# =============================================================================================
# mpippo: DQN, Ape-X layout, on ONE node with 48 cores and GPUs: 1 learner + 47 actors.
#
#   sbatch slurm/dqn_6gpu.sh                                   # configs/dqn_procgen.yaml, 25M steps
#   sbatch slurm/dqn_6gpu.sh --total-timesteps 50000000 --set env.name=starpilot
#
# Layout: rank 0 is the learner (replay, target net, optimizer) on one GPU; ranks 1-47 are CPU
# actors. Why one learner and 47 actors rather than one learner per GPU: a DQN learner uses one
# GPU, and one GPU learner consumes the transitions of ~47 CPU actors at the default replay
# ratio, so this is the fastest single agent. The job asks for ONE GPU, so on a 6-GPU node the
# other five stay free for other jobs; to use all six for six independent agents (e.g. seeds or
# games), submit slurm/dqn_6agents.sh instead.
# Run it from the repository root. For your site, edit the --partition / --account lines and the
# ENVIRONMENT block in slurm/common.sh. Options after the script name go to run_mpi.py.
# On a node whose CUDA is not usable the learner falls back to the CPU with one warning.
# =============================================================================================
#SBATCH --job-name=mpippo-dqn
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
source "$COMMON" --config configs/dqn_procgen.yaml "$@"
