"""What the actor-learner layout's learners share (Ape-X DQN's and APPO's): the parameters as one flat
buffer, Adam stepped over it by a few device kernels (DeviceAdam), and the guard that skips a
step with a non-finite loss or gradient on the device and counts the ones in a row
(NonFiniteGuard, guards.max_nonfinite_skips), with the one line that ends a diverged learner.
No host read in a step: a GPU learner never waits for its own update."""
from __future__ import annotations

import torch

from mpippo.models.flat import flatten_parameters_


def flat_view(params) -> torch.Tensor | None:
    """One 1-D tensor over all of `params` when they are, in order, contiguous views of one buffer
    (models.flat.flatten_parameters_ makes them so); else None."""
    params = list(params)
    if not params:
        return None
    first, n = params[0], 0
    base = first.untyped_storage().data_ptr()
    for p in params:
        if (p.untyped_storage().data_ptr() != base or p.dtype != first.dtype or not p.is_contiguous()
                or p.storage_offset() != first.storage_offset() + n):
            return None
        n += p.numel()
    return first.detach().as_strided((n,), (1,), first.storage_offset())


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """The model's parameters as one flat buffer: the one they already are views of, or a new one."""
    flat = flat_view(model.parameters())
    if flat is None:
        flatten_parameters_(model)
        flat = flat_view(model.parameters())
    return flat


class DeviceAdam:
    """Adam's steps for an optimizer `opt` (mpippo.algos.adam.Adam or torch.optim.Adam: one group, no
    weight decay; its param_groups[0]["lr"] is read at every step, so annealing works as before) over
    one flat buffer each for the parameters (`params`: views of one buffer, see flat_parameters), the
    gradients (every parameter's .grad becomes a view of `g`) and the two moments (the optimizer's state
    holds views of `m` and `v`, so its state_dict keeps torch's layout). About twenty kernels a step
    whatever the number of layers.

    step(ok) takes the step with a bool tensor `ok` decided on the device: where it is false nothing
    moves (parameters, moments, step count), with no read by the host. The step count lives on the
    device (`steps`); sync() writes it into the optimizer's state (before its state_dict is saved),
    adopt() takes the optimizer's state over (after it was loaded)."""

    def __init__(self, params, opt):
        self.params, self.opt = list(params), opt
        self.p = flat_view(self.params)
        if self.p is None:
            raise ValueError("DeviceAdam: the parameters must be views of one flat buffer (flat_parameters)")
        self.g, self.m, self.v = torch.zeros_like(self.p), torch.zeros_like(self.p), torch.zeros_like(self.p)
        self.steps = torch.zeros((), dtype=torch.float32, device=self.p.device)
        self.slices, offset = [], 0
        for p in self.params:
            self.slices.append(slice(offset, offset + p.numel()))
            p.grad = self.g[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.adopt()

    def adopt(self) -> None:
        """Take over the optimizer's state: its moments (zeros when it has none yet) into the flat buffers,
        which its state then holds views of, and its step count onto the device."""
        steps = 0.0
        for p, sl in zip(self.params, self.slices):
            st = self.opt.state.get(p) if hasattr(self.opt.state, "get") else None
            if st and "exp_avg" in st:
                self.m[sl].copy_(st["exp_avg"].reshape(-1))
                self.v[sl].copy_(st["exp_avg_sq"].reshape(-1))
                steps = float(st["step"])
            else:
                self.m[sl].zero_()
                self.v[sl].zero_()
        for p, sl in zip(self.params, self.slices):
            self.opt.state[p] = {"step": torch.tensor(steps, dtype=torch.float32),
                                 "exp_avg": self.m[sl].view_as(p), "exp_avg_sq": self.v[sl].view_as(p)}
        self.steps.fill_(steps)

    def sync(self) -> None:
        """The device's step count into the optimizer's state (one read: at a checkpoint)."""
        steps = float(self.steps)
        for p in self.params:
            self.opt.state[p]["step"] = torch.tensor(steps, dtype=torch.float32)

    def zero_grad(self) -> None:
        self.g.zero_()

    def grads_finite(self) -> torch.Tensor:
        return torch.isfinite(self.g).all()

    def clip_(self, max_norm: float) -> torch.Tensor:
        """Scale the gradient to norm <= max_norm (as torch.nn.utils.clip_grad_norm_); returns its norm
        before (not finite when a gradient is not)."""
        norm = torch.linalg.vector_norm(self.g)
        self.g.mul_((max_norm / (norm + 1e-6)).clamp_(max=1.0))
        return norm

    @torch.no_grad()
    def step(self, ok: torch.Tensor | None = None) -> None:
        group = self.opt.param_groups[0]
        lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
        if ok is None:
            self.steps.add_(1.0)
            w1, w2 = 1.0 - b1, b2
        else:
            self.g.masked_fill_(~ok, 0.0)  # a skipped step's gradient moves nothing (and is not NaN)
            self.steps.add_(ok.to(self.steps.dtype))
            w1, w2 = torch.where(ok, 1.0 - b1, 0.0), torch.where(ok, b2, 1.0)
        self.m.lerp_(self.g, w1)
        self.v.mul_(w2).addcmul_(self.g, self.g, value=1.0 - b2)
        t = self.steps.clamp(min=1.0)  # (no step yet and this one skipped: keeps the corrections finite)
        step_size = lr / (1.0 - b1 ** t)
        denom = (self.v.sqrt() / (1.0 - b2 ** t).sqrt()).add_(eps)
        update = (self.m / denom).mul_(step_size)
        if ok is not None:
            update.masked_fill_(~ok, 0.0)
        self.p.sub_(update)


class NonFiniteGuard:
    """guards.max_nonfinite_skips, counted on the device: admit(ok) says whether a step is taken (ok,
    and the guard not yet tripped), counts the skipped ones and the streak of them, and trips when
    the streak reaches `limit`; once tripped no step is taken. read() is the host's one look."""

    def __init__(self, limit: int, device, streak: int = 0, skipped: int = 0):
        self.limit = limit
        self.counts = torch.tensor([streak, skipped, int(streak >= limit)], dtype=torch.int64, device=device)

    def admit(self, ok: torch.Tensor) -> torch.Tensor:
        streak, skipped, tripped = self.counts.unbind()
        live = tripped == 0
        take, bad = ok & live, ~ok & live
        self.counts = torch.stack([torch.where(take, 0, streak + bad.long()), skipped + bad.long(),
                                   tripped | (streak + bad.long() >= self.limit).long()])
        return take

    def read(self) -> tuple[int, int, bool]:
        """(streak, skipped, tripped)."""
        streak, skipped, tripped = self.counts.tolist()
        return streak, skipped, bool(tripped)


def nonfinite_message(what: str, streak: int, limit: int, lr: float, loss: float | None = None,
                      unit: str = "learner updates") -> str:
    """The one line that ends a learner whose steps kept failing (APPO's too)."""
    last = f" (last loss {loss:g})" if loss is not None else ""
    return (f"{what} or its gradient was not finite{last} in {streak} consecutive {unit}, each skipped "
            f"(guards.max_nonfinite_skips = {limit}): training diverged; lower training.learning_rate (now {lr:g})")
