"""Failures that every rank detects together (after a collective decision).

They end the job cleanly on all ranks -- one message from rank 0, exit code 1 -- instead
of the abort path that a failure on a single rank needs.
"""


class JobFailure(RuntimeError):
    pass


class CheckpointError(JobFailure):
    """Rank 0 could not write a checkpoint (disk full, quota, permissions)."""


class NonFiniteError(JobFailure, FloatingPointError):
    """Too many consecutive steps with NaN/Inf loss or gradients on some rank."""


class ReplicaDivergence(JobFailure):
    """The ranks' parameters are no longer bit-identical."""
