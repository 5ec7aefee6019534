"""Where a run's scalars go, behind one call for every algorithm and layout: `add_scalar(tag, value,
step)` to TensorBoard (`logging.tensorboard`) and to Weights & Biases (`logging.wandb`: off by
default; offline writes the run under <run>/wandb/ for a later `wandb sync`, online streams it; the
`wandb` package is optional and imported only when asked for). The tags are the same in every
algorithm: charts/ (returns, steps_per_s), losses/, learner/, time/, selfplay/.
"""
from __future__ import annotations

import secrets
from pathlib import Path

WANDB_ID = "wandb-id"  # a run folder's W&B run id: a resumed run continues the same W&B run


class Sinks:
    def __init__(self, cfg, run_dir: Path, purge_step: int | None):
        self.tb = self.wb = None
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            # purge_step drops points past the resume step, so a resumed run has no duplicates
            self.tb = SummaryWriter(str(Path(run_dir) / "logs"), purge_step=purge_step)
        if cfg.logging.wandb != "off":
            self.wb = _wandb_run(cfg, Path(run_dir))

    def __bool__(self) -> bool:
        return self.tb is not None or self.wb is not None

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None:
            self.tb.add_scalar(tag, value, step)
        if self.wb is not None:
            self.wb.log({tag: value}, step=int(step))

    def add_histogram_raw(self, tag: str, **kwargs) -> None:
        """A histogram (TensorBoard's raw form; W&B gets its summary scalars from the caller)."""
        if self.tb is not None:
            self.tb.add_histogram_raw(tag, **kwargs)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish()


def _wandb_run(cfg, run_dir: Path):
    """The run folder's W&B run (its id kept in the folder), in the mode the config asks for."""
    import wandb
    id_file = run_dir / WANDB_ID
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
    if not id_file.is_file():
        from mpippo.checkpoint import atomic_write_bytes
        atomic_write_bytes(id_file, run_id.encode())
    return wandb.init(project=cfg.logging.wandb_project, dir=str(run_dir), mode=cfg.logging.wandb, id=run_id,
                      resume="allow", name=run_dir.name, config=cfg.to_dict(), settings=wandb.Settings(silent=True))
