"""Flat parameter and gradient storage.

All parameters of a module become views of one contiguous tensor (one Bcast for initial
weights, one checksum for replica checks), and all gradients views of another (one
Allreduce per minibatch, no copies). Autograd accumulates into an existing .grad in
place, so the views survive backward as long as grads are zeroed, never set to None.
"""
from __future__ import annotations

import torch
from torch import nn


def flatten_parameters_(module: nn.Module) -> torch.Tensor:
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).contiguous()
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset: offset + n].view_as(p)
        offset += n
    return flat


def attach_flat_grads_(module: nn.Module, grad_flat: torch.Tensor) -> None:
    offset = 0
    for p in module.parameters():
        n = p.numel()
        p.grad = grad_flat[offset: offset + n].view_as(p)
        offset += n
    if offset != grad_flat.numel():
        raise ValueError(f"gradient buffer has {grad_flat.numel()} elements, parameters {offset}")


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def flat_model_(module: nn.Module, grad_flat: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten parameters and gradients of `module` in place; returns (flat params, flat grads).

    The flat parameter tensor carries the flat gradient as its .grad, so an optimizer over
    [flat params] updates every layer in one fused step. Pass `grad_flat` to choose the
    gradient storage (the MPI buffer); otherwise it is allocated here.
    """
    flat = flatten_parameters_(module)
    grad = torch.zeros_like(flat) if grad_flat is None else grad_flat
    attach_flat_grads_(module, grad)
    flat.grad = grad
    return flat, grad
