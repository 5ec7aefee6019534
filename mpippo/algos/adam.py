"""Adam: torch's own update (`torch.optim.adam.adam`, the function `torch.optim.Adam.step` calls),
with the parameter and state bookkeeping of `torch.optim.Adam` and its state_dict layout.

Why not `torch.optim.Adam` itself: its constructor, `step`, `zero_grad` and `state_dict` are wrapped
for `torch.compile`, and the first call of any of them imports torch's compiler stack (torch._dynamo,
sympy, inductor, FSDP): 2.2 s of CPU in every process that trains, 100 CPU-seconds for a 48-rank job
at each start and requeue, and a sixth of the test suite's CPU time. mpippo compiles nothing, so it
keeps the arithmetic and drops the wrappers. The result is bit-identical to `torch.optim.Adam` (same
function, same arguments; tests/unit/test_adam.py), and checkpoints of either load into the other.

It runs torch's fused kernel (`fused=True`) on every device: one pass over the parameters instead of
about ten elementwise ones (on one CPU thread, 1.5 ms a step instead of 13 for the Nature CNN's 1.7M
parameters; a sixth of a 2-rank Atari run's update time went to Adam before); on a GPU one launch per
step with its step count on the device, so the update waits for nothing on the host. Its numbers
differ from the default kernels' in the last bits (torch.optim.Adam(fused=True) gives the same bits);
fused=False keeps the default kernels (the tests compare both with torch.optim.Adam).
"""
from __future__ import annotations

import copy

import torch
from torch.optim.adam import adam


class Adam:
    """The subset of `torch.optim.Adam` mpippo uses: one parameter group, no weight decay, no
    amsgrad; `param_groups[0]["lr"]` may be changed between steps (learning-rate annealing).
    A subclass with other MOMENTS and its own `step` is another torch.optim rule with the same
    bookkeeping."""
    MOMENTS = ("exp_avg", "exp_avg_sq")  # the per-parameter state beside the step count, shaped like the parameter

    def __init__(self, params, lr: float, eps: float, betas: tuple[float, float] = (0.9, 0.999),
                 fused: bool | None = None):
        params = list(params)
        if fused is None:  # torch's fused kernel wherever there are parameters (the module docstring says why)
            fused = bool(params)
        # the keys torch.optim.Adam writes into a state_dict, so that its checkpoints load here and back
        group = dict(lr=lr, betas=betas, eps=eps, weight_decay=0, amsgrad=False, maximize=False, foreach=None,
                     capturable=False, differentiable=False, fused=True if fused else None,
                     decoupled_weight_decay=False)
        self.param_groups = [{**group, "params": params}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @property
    def params(self) -> list[torch.Tensor]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:  # in place: sync PPO's gradients are views of one flat buffer and must stay so
                p.grad.requires_grad_(False)
                p.grad.zero_()

    def _step_device(self, p: torch.Tensor) -> torch.device:
        """Where `step` lives, as torch keeps it: on the parameter's device for the fused kernel (which
        reads it there), else a CPU scalar (one kernel launch less per step)."""
        return p.device if self.param_groups[0].get("fused") else torch.device("cpu")

    def _moments(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """Created at the first step, as torch does: `step` a float32 scalar, the moments shaped like
        the parameter."""
        if p not in self.state:
            self.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32, device=self._step_device(p)),
                             **{m: torch.zeros_like(p, memory_format=torch.preserve_format) for m in self.MOMENTS}}
        return self.state[p]

    @torch.no_grad()
    def step(self) -> None:
        g = self.param_groups[0]
        params = [p for p in self.params if p.grad is not None]
        states = [self._moments(p) for p in params]
        adam(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
             [], [s["step"] for s in states], foreach=g["foreach"], capturable=False, differentiable=False,
             fused=g["fused"], has_complex=any(torch.is_complex(p) for p in params), amsgrad=False,
             beta1=g["betas"][0], beta2=g["betas"][1], lr=g["lr"], weight_decay=0, eps=g["eps"], maximize=False)

    def state_dict(self) -> dict:
        """torch.optim's layout: parameters by index; the tensors themselves, not copies (as torch)."""
        index = {id(p): i for i, p in enumerate(self.params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {"state": {index[id(p)]: dict(s) for p, s in self.state.items()},
                "param_groups": [{**group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, sd: dict) -> None:
        """A state_dict of this class or of torch.optim.Adam over parameters of the same shapes;
        a mismatch raises ValueError (callers turn it into their one-line refusal)."""
        groups = sd["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(groups)} group(s) of {[len(g['params']) for g in groups]} "
                             f"parameter(s); this optimizer has 1 group of {len(self.params)}")
        state = {}
        for i, s in sd["state"].items():
            p = self.params[int(i)]
            for m in self.MOMENTS:
                if s[m].shape != p.shape:
                    raise ValueError(f"optimizer state {i} has shape {tuple(s[m].shape)}, parameter {tuple(p.shape)}")
            # as torch: moments to the parameter's device and dtype; the step count where this
            # optimizer keeps it (a checkpoint of a GPU run resumes on a CPU, and back)
            step = s["step"].to(dtype=torch.float32, device=self._step_device(p))
            state[p] = {"step": step, **{m: s[m].to(dtype=p.dtype, device=p.device) for m in self.MOMENTS}}
        # the hyperparameters as saved; the kernels (fused, foreach) this optimizer's device chose
        saved = copy.deepcopy({k: v for k, v in groups[0].items() if k not in ("params", "fused", "foreach")})
        self.param_groups = [{**self.param_groups[0], **saved, "params": self.params}]
        self.state = state
