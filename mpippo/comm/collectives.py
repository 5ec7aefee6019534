"""Collectives of synchronous PPO, each over one preallocated contiguous buffer.

GradAllreduce: per minibatch, the gradients of every parameter already live in one flat
buffer (see models.flat); two extra slots carry the non-finite flag and approx_kl, so a
single Allreduce averages gradients, tells every rank whether any rank saw NaN/Inf, and
gives the global KL for early stopping -- decisions all ranks then take identically. On a
GPU the slots are written on the device, so the one copy to the host carries all three.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from mpippo.comm.world import MPI, World


class GradAllreduce:
    SLOT_NONFINITE, SLOT_KL, N_SLOTS = 0, 1, 2

    def __init__(self, world: World, n: int, device: torch.device):
        self.world, self.n = world, n
        on_gpu = device.type != "cpu"
        # On CPU the MPI buffer *is* the gradient storage plus the slots: no copies. On GPU the
        # gradients and the slots live in one device buffer, copied to a pinned host mirror in one
        # piece (the minibatch's only wait for the device), reduced there with any MPI, CUDA-aware
        # or not, and copied back.
        self.host = torch.zeros(n + self.N_SLOTS, dtype=torch.float32, pin_memory=on_gpu and torch.cuda.is_available())
        self.device_buf = torch.zeros(n + self.N_SLOTS, dtype=torch.float32, device=device) if on_gpu else None
        self.grad = self.device_buf[:n] if on_gpu else self.host[:n]
        self.slots = self.host[n:]
        self._np = self.host.numpy()
        self.poison_steps = 0  # fault injection (tests): NaN gradients in the next this-many calls

    def __call__(self, approx_kl, weight: float | None = None) -> tuple[float, int]:
        """Average grads over ranks in place. approx_kl: a float or a 0-d tensor on the grads'
        device. weight: this rank's share of the global minibatch when ranks hold unequal numbers
        of samples (the balanced cut-off): the grads are scaled by it and summed, which gives the
        gradient of the mean loss over every rank's samples; None: equal shares, the plain mean.
        Returns (global mean approx_kl, #ranks non-finite)."""
        if self.poison_steps:
            self.grad.fill_(float("nan"))
            self.poison_steps -= 1
        if self.device_buf is not None:
            return self._on_device(approx_kl, weight)
        finite = bool(torch.isfinite(self.grad).all())
        if self.world.size == 1:
            return float(approx_kl), int(not finite)
        self.slots[self.SLOT_NONFINITE] = 0.0 if finite else 1.0
        self.slots[self.SLOT_KL] = float(approx_kl) * (1.0 if weight is None else weight)
        if weight is not None:
            self.grad.mul_(weight)
        return self._reduce(weight)

    def _on_device(self, approx_kl, weight: float | None) -> tuple[float, int]:
        slots = self.device_buf[self.n:]
        slots[self.SLOT_NONFINITE] = (~torch.isfinite(self.grad).all()).float()
        slots[self.SLOT_KL] = approx_kl if weight is None else approx_kl * weight
        if self.world.size == 1:  # nothing to average: only the verdict comes to the host
            bad, kl = slots.tolist()
            return kl, int(bad)
        if weight is not None:
            self.grad.mul_(weight)
        self.host.copy_(self.device_buf)
        out = self._reduce(weight)
        self.grad.copy_(self.host[: self.n], non_blocking=True)  # pinned: the copy queues, the host goes on
        if weight is None:
            self.grad.div_(self.world.size)
        return out

    def _reduce(self, weight: float | None) -> tuple[float, int]:
        self.world.allreduce_(self._np, "sum", name="grad_allreduce")
        divisor = self.world.size if weight is None else 1  # weighted: the sum is already the mean
        if self.device_buf is None and divisor != 1:
            self.grad.div_(divisor)
        return float(self.slots[self.SLOT_KL]) / divisor, int(round(float(self.slots[self.SLOT_NONFINITE])))


def global_moments(world: World, x: np.ndarray) -> tuple[float, float, float]:
    """(count, mean, var) of every rank's samples together, weighted by counts: one Allreduce of 3 numbers."""
    x = np.asarray(x, dtype=np.float64)
    buf = np.array([x.size, x.sum(), (x * x).sum()], dtype=np.float64)
    n, s, ss = world.allreduce_(buf, "sum", name="moments")
    mean = s / max(n, 1.0)
    return n, mean, max(ss / max(n, 1.0) - mean * mean, 0.0)


def global_step_moments(world: World, x: np.ndarray, steps: int | None = None) -> np.ndarray:
    """(T, 3): (count, mean, var) of row t of every rank's (T, N) `x` together: one Allreduce of 3T numbers.
    steps: this rank's rows are only the first `steps` (the balanced cut-off); the rest count 0."""
    x = np.asarray(x, dtype=np.float64)
    steps = x.shape[0] if steps is None else steps
    buf = np.zeros((x.shape[0], 3), dtype=np.float64)
    buf[:steps] = np.stack([np.full(steps, x.shape[1], dtype=np.float64), x[:steps].sum(1), (x[:steps] ** 2).sum(1)],
                           axis=1)
    world.allreduce_(buf, "sum", name="step_moments")
    n, mean = buf[:, 0], buf[:, 1] / np.maximum(buf[:, 0], 1.0)
    buf[:, 1], buf[:, 2] = mean, np.maximum(buf[:, 2] / np.maximum(n, 1.0) - mean * mean, 0.0)
    return buf


def global_mean_std(world: World, x: torch.Tensor) -> tuple[float, float]:
    """Mean and (population) std of the concatenation of every rank's `x`."""
    _, mean, var = global_moments(world, x.detach().double().cpu().numpy())
    return mean, var ** 0.5


def param_checksum(flat_params: torch.Tensor) -> int:
    return zlib.crc32(flat_params.detach().cpu().numpy().tobytes())


def check_replicas(world: World, flat_params: torch.Tensor) -> list[int]:
    """Ranks whose parameters differ from rank 0's (bitwise). Every rank gets the same list."""
    sums = world.allgather(np.array([param_checksum(flat_params)], dtype=np.int64), name="checksum")[:, 0]
    return [r for r in range(world.size) if sums[r] != sums[0]]


class RolloutCutoff:
    """The balanced cut-off's one message (training.rollout_cutoff). A rank that has collected its
    whole rollout tells every other rank with an empty message (non-blocking); a rank still
    collecting asks, between env steps, whether `needed` ranks have (a probe, microseconds) and then
    stops. After the rollout one Allgather gives every rank every rank's step count, from which each
    rank also knows how many messages are still on their way to it, and takes them: none is left
    to mix with the next rollout's (whose messages no rank can send before every rank is past this
    one's gradient Allreduces)."""

    TAG = 0x5C0F

    def __init__(self, world: World, needed: int):
        self.world, self.needed = world, needed
        self.full_ranks = 0  # ranks known to have their whole rollout, this one included
        self._sends: list = []
        self._token = np.zeros(1, dtype=np.int8)  # sent by reference: must live until sent

    def full(self) -> None:
        """This rank has collected its whole rollout."""
        self.full_ranks += 1
        comm = self.world.comm
        self._sends = [comm.Isend(self._token, dest=r, tag=self.TAG) for r in range(self.world.size)
                       if r != self.world.rank]

    def enough(self) -> bool:
        """Whether `needed` ranks have their whole rollout, by the messages arrived so far."""
        while self.world.comm.Iprobe(source=MPI.ANY_SOURCE, tag=self.TAG):
            self._take()
        return self.full_ranks >= self.needed

    def _take(self) -> None:
        self.world.comm.Recv(np.empty(1, dtype=np.int8), source=MPI.ANY_SOURCE, tag=self.TAG)
        self.full_ranks += 1

    def end(self, steps: int, n_steps: int) -> np.ndarray:
        """Every rank's steps this rollout (collective); the pending messages taken, the count reset."""
        counts = self.world.allgather(np.array([steps], dtype=np.int64), name="rollout_steps")[:, 0]
        while self.full_ranks < int((counts == n_steps).sum()):
            self._take()  # sent before its sender entered the Allgather: it is here or arriving
        MPI.Request.Waitall(self._sends)
        self._sends, self.full_ranks = [], 0
        return counts
