#!/bin/bash
# =============================================================================================
# mpippo: synchronous PPO on ONE node with 6 GPUs: 6 ranks x 8 CPUs, one GPU per rank.
#
#   sbatch slurm/ppo_6gpu.sh                                    # default config, 25M steps
#   sbatch slurm/ppo_6gpu.sh --total-timesteps 200000000 --set env.name=starpilot
#   sbatch --nodes=2 slurm/ppo_6gpu.sh                          # several such nodes: 6 ranks each
#
# Each rank takes the GPU of its node-local rank (CUDA_VISIBLE_DEVICES from --gpus-per-node),
# runs inference and training there (training.device auto), and steps its envs with its 8
# CPUs (procgen threads = the rank's CPU share; env.num_threads overrides). The default config's
# 64 envs become 11 per rank (66 in all); the gradient Allreduce goes through a pinned host copy.
# When to prefer it over ppo_48core.sh: whenever the node's GPUs are free. The Procgen paper's
# PPO ran 3.8-4.8k steps/s on one GPU; 48 CPU ranks reach about 6k (fp32) to 10k (bf16) on this
# project's measured per-core cost (modeled, docs/cluster.md), so six GPU ranks should be several
# times faster.
# GPU numbers: not yet measured on such a node (make gpu-check prints them where a GPU is at hand).
# On a node whose CUDA is not usable the ranks fall back to the CPU with one warning.
# Run it from the repository root. For your site, edit the --partition / --account lines and the
# ENVIRONMENT block in slurm/common.sh. Preemption-safe like ppo_48core.sh.
# =============================================================================================
#SBATCH --job-name=mpippo-ppo6gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=6
#SBATCH --cpus-per-task=8
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
source "$COMMON" --device auto "$@"
