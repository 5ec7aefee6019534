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

from mpippo.comm.world import World


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

    def __call__(self, approx_kl) -> tuple[float, int]:
        """Average grads over ranks in place. approx_kl: a float or a 0-d tensor on the grads'
        device. Returns (global mean approx_kl, #ranks non-finite)."""
        if self.poison_steps:
            self.grad.fill_(float("nan"))
            self.poison_steps -= 1
        if self.device_buf is not None:
            return self._on_device(approx_kl)
        finite = bool(torch.isfinite(self.grad).all())
        if self.world.size == 1:
            return float(approx_kl), int(not finite)
        self.slots[self.SLOT_NONFINITE] = 0.0 if finite else 1.0
        self.slots[self.SLOT_KL] = float(approx_kl)
        return self._reduce()

    def _on_device(self, approx_kl) -> tuple[float, int]:
        slots = self.device_buf[self.n:]
        slots[self.SLOT_NONFINITE] = (~torch.isfinite(self.grad).all()).float()
        slots[self.SLOT_KL] = approx_kl
        if self.world.size == 1:  # nothing to average: only the verdict comes to the host
            bad, kl = slots.tolist()
            return kl, int(bad)
        self.host.copy_(self.device_buf)
        out = self._reduce()
        self.grad.copy_(self.host[: self.n], non_blocking=True)  # pinned: the copy queues, the host goes on
        self.grad.div_(self.world.size)
        return out

    def _reduce(self) -> tuple[float, int]:
        self.world.allreduce_(self._np, "sum", name="grad_allreduce")
        if self.device_buf is None:
            self.grad.div_(self.world.size)
        return float(self.slots[self.SLOT_KL]) / self.world.size, int(round(float(self.slots[self.SLOT_NONFINITE])))


def global_moments(world: World, x: np.ndarray) -> tuple[float, float, float]:
    """(count, mean, var) of every rank's samples together, weighted by counts: one Allreduce of 3 numbers."""
    x = np.asarray(x, dtype=np.float64)
    buf = np.array([x.size, x.sum(), (x * x).sum()], dtype=np.float64)
    n, s, ss = world.allreduce_(buf, "sum", name="moments")
    mean = s / max(n, 1.0)
    return n, mean, max(ss / max(n, 1.0) - mean * mean, 0.0)


def global_step_moments(world: World, x: np.ndarray) -> np.ndarray:
    """(T, 3): (count, mean, var) of row t of every rank's (T, N) `x` together: one Allreduce of 3T numbers."""
    x = np.asarray(x, dtype=np.float64)
    buf = np.stack([np.full(x.shape[0], x.shape[1], dtype=np.float64), x.sum(1), (x * x).sum(1)], axis=1)
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
