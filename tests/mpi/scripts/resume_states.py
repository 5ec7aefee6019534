"""Run under mpirun -n W (or plain python for one rank): build the sync trainer from a run's
checkpoint on W ranks, as `--resume` does, and save every rank's state right after the resume.

    resume_states.py RUN_DIR OUT [section.key=value ...]

The config is the run's own config.yaml (its env.num_envs_per_rank unset, as asked: env.num_envs,
the job's total, is divided over W ranks) and the overrides applied. Rank 0
writes OUT (torch.save): {"note": the trainer's resume note, "ranks": every rank's rank_state()}."""
import sys
from pathlib import Path

import torch
import yaml

from mpippo import config as C
from mpippo.checkpoint import load_checkpoint
from mpippo.comm import World
from mpippo.runners.sync import SyncTrainer

world = World(collective_timeout_s=120)
world.install_abort_hook()
run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
data = yaml.safe_load((run_dir / "config.yaml").read_text())
cfg = C.resolve(C.build(data, [C.parse_override(s) for s in sys.argv[3:]], world.size), world.size)
state = load_checkpoint((run_dir / "checkpoints" / "latest.pt").read_bytes(), "checkpoint", "ppo")
trainer = SyncTrainer(cfg, world, out.parent / f"scratch_{world.size}", resume_state=state)
if trainer.obs is None:  # fresh envs: their first observation, as train() takes it
    _, trainer.obs, trainer.first = trainer.env.observe()
ranks = world.gather_obj(trainer.rank_state())
if world.is_root:
    torch.save({"note": trainer.resume_note, "ranks": ranks}, out)
