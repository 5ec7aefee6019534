"""What an mpippo checkpoint holds: keys, types and shapes, checked before any rank acts on it.

`checkpoint.load_checkpoint` unpickles without running code; `validate` then checks that the
result is what the trainers and `mpippo.evaluate` read (the same check in all three, so one
file gets one verdict), and names the first problem in one line, e.g.
`ranks[1].obs: expected a uint8 array of shape (4, 64, 64, 3), got float32 (4, 64, 64, 3)`.
Shapes come from the checkpoint's own config: the network is built on torch's meta device
(no memory) and every weight and Adam moment is compared with it.

This module holds the checking primitives and the parts every checkpoint of a layout has; what an
algorithm adds is checked by its own `check_checkpoint`, beside the code that writes it, which the
caller of `validate` hands in (checkpoint.load_checkpoint: algos/implementations.py's classes).

Format: every checkpoint says which one it is (`format`, FORMAT today; the files written before the
key existed are format 1). `upgrade` brings an older file to today's by one step per format (UPGRADES),
before it is checked, so the readers only ever see today's keys; tests/data/checkpoints/format1/ holds
files of format 1 that must keep loading. A file of a newer format is refused in one line.
"""
from __future__ import annotations

import math
import random
import sys

import numpy as np
import torch

from mpippo import config as C
from mpippo import envs, resume
from mpippo.algos import registry
from mpippo.envs.family import MAX_ACTIONS, MAX_SIDE, MAX_VECTOR

show = C.show  # a bad value, shortened, for the messages of the algorithms' checks
MAX_WORLD = 1 << 20  # ranks: far above any cluster, far below what breaks a list


class Bad(ValueError):
    """The first problem found, as 'key.path: what is wrong'."""


def need(ok: bool, path: str, what: str) -> None:
    if not ok:
        raise Bad(f"{path}: {what}")


def is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_(v, path: str, lo: int = 0, hi: int = C.INT64_MAX) -> int:
    need(is_int(v) and lo <= v <= hi, path, f"expected an int in [{lo}, {hi}], got {C.show(v)}")
    return int(v)


def num(v, path: str, lo: float = -math.inf) -> float:
    ok = (is_int(v) or isinstance(v, (float, np.floating))) and math.isfinite(v) and v >= lo
    need(ok, path, f"expected a finite number >= {lo}, got {C.show(v)}")
    return float(v)


def mapping(v, path: str, keys=()) -> dict:
    need(isinstance(v, dict), path, f"expected a mapping, got {type(v).__name__}")
    missing = [k for k in keys if k not in v]
    need(not missing, path, f"missing key(s) {', '.join(map(str, missing))}")
    return v


def seq(v, path: str, length: int | None = None) -> list:
    need(isinstance(v, (list, tuple)), path, f"expected a list, got {type(v).__name__}")
    need(length is None or len(v) == length, path, f"expected {length} entries, got {len(v)}")
    return v


def array(v, path: str, kind: str, shape: tuple) -> np.ndarray:
    """A numpy array of dtype kind ('u'int, 'i'nt, 'f'loat, 'b'ool; 'u1' = uint8) and exact shape."""
    ok = isinstance(v, np.ndarray) and v.shape == tuple(shape) and (
        v.dtype == np.uint8 if kind == "u1" else v.dtype.kind == kind)
    got = f"{v.dtype} {v.shape}" if isinstance(v, np.ndarray) else type(v).__name__
    need(ok, path, f"expected a {kind} array of shape {tuple(shape)}, got {got}")
    return v


def tensor(v, path: str, shape: tuple | None = None, dtype=None) -> torch.Tensor:
    ok = isinstance(v, torch.Tensor) and (shape is None or tuple(v.shape) == tuple(shape)) and (
        dtype is None or v.dtype == dtype)
    got = f"{v.dtype} {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
    need(ok, path, f"expected a {dtype or ''} tensor{f' of shape {tuple(shape)}' if shape is not None else ''}, got {got}")
    return v


def restores(path: str, what: str, restore) -> None:
    """An RNG state is only known good once something accepted it: try it on a fresh generator."""
    try:
        restore()
    except (TypeError, ValueError, KeyError, IndexError, RuntimeError, OverflowError):
        raise Bad(f"{path}: not a valid {what} state") from None


def pcg64(v, path: str) -> None:
    def set_():
        np.random.default_rng().bit_generator.state = v
    restores(path, "numpy Generator", set_)


# ---- the parts ----
def check_config(state: dict) -> C.Config:
    """The checkpoint's config, type-checked as a config file would be."""
    errors: list[str] = []
    cfg = C.from_dict(mapping(state["config"], "config"), errors)
    need(not errors, "config", errors[0] if errors else "")
    ch = cfg.model.channels
    need(bool(ch) and all(is_int(c) and c > 0 for c in ch), "config.model.channels", f"bad channels {C.show(ch)}")
    need(cfg.model.hidden_size > 0, "config.model.hidden_size", f"must be > 0, got {cfg.model.hidden_size}")
    need(envs.family_of(cfg.env.name) is not None, "config.env.name", f"unknown environment {C.show(cfg.env.name)}")
    return cfg


def meta_network(state: dict, cfg: C.Config) -> torch.nn.Module:
    """The network the checkpoint describes (its algorithm's, models.build), on the meta device
    (shapes only, no memory)."""
    spec = mapping(state["model_spec"], "model_spec", ("obs_shape", "num_actions"))
    obs = seq(spec["obs_shape"], "model_spec.obs_shape")
    need(len(obs) in (1, 3), "model_spec.obs_shape", f"expected (D,) or (H, W, C), got {C.show(obs)}")
    for i, d in enumerate(obs):
        int_(d, f"model_spec.obs_shape[{i}]", 1, MAX_VECTOR if len(obs) == 1 else MAX_SIDE)
    need(spec.get("obs_dtype", "uint8") == ("uint8" if len(obs) == 3 else "float32"), "model_spec.obs_dtype",
         f"expected uint8 for images, float32 for vectors, got {C.show(spec.get('obs_dtype'))}")
    fam = envs.family(cfg)
    if fam.static_spaces:  # (a Gymnasium env's are checked against the env once one is made)
        want = fam.spaces(cfg).obs_shape
        need(tuple(obs) == want, "model_spec.obs_shape", f"{list(obs)} is not the observation of {cfg.env.name} "
             f"{list(want)}")
    actions = int_(spec["num_actions"], "model_spec.num_actions", 1, MAX_ACTIONS)
    continuous = spec.get("continuous", False)
    need(continuous in (True, False) and not (continuous and len(obs) == 3), "model_spec.continuous",
         f"expected true or false (true with vector observations only), got {C.show(continuous)}")
    with torch.device("meta"):
        return registry.get(state["algo"]).build_network(cfg, obs, actions, continuous=bool(continuous))


def check_weights(sd, path: str, net: torch.nn.Module) -> None:
    mapping(sd, path)
    want = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    need(set(sd) == set(want), path, f"its keys are not the network's (missing {sorted(set(want) - set(sd))[:3]}, "
                                     f"unexpected {sorted(map(str, set(sd) - set(want)))[:3]})")
    for k, shape in want.items():
        tensor(sd[k], f"{path}.{k}", shape, torch.float32)


def check_adam(opt, path: str, shapes: list[tuple]) -> None:
    """An Adam state_dict over parameters of these shapes (in order)."""
    check_optimizer(opt, path, shapes, ("exp_avg", "exp_avg_sq"))


def check_optimizer(opt, path: str, shapes: list[tuple], moments: tuple[str, ...]) -> None:
    """A torch.optim-layout state_dict of one group over parameters of these shapes (in order),
    each parameter's state a step count and these moments, shaped like it."""
    mapping(opt, path, ("state", "param_groups"))
    groups = seq(opt["param_groups"], f"{path}.param_groups")
    need(len(groups) == 1, f"{path}.param_groups", f"expected 1 group, got {len(groups)}")
    g = mapping(groups[0], f"{path}.param_groups[0]", ("lr", "params"))
    need(list(g["params"]) == list(range(len(shapes))), f"{path}.param_groups[0].params",
         f"expected ids 0..{len(shapes) - 1}, got {C.show(g['params'])}")
    for key, st in mapping(opt["state"], f"{path}.state").items():
        need(is_int(key) and 0 <= key < len(shapes), f"{path}.state", f"unknown parameter id {C.show(key)}")
        mapping(st, f"{path}.state[{key}]", ("step", *moments))
        tensor(st["step"], f"{path}.state[{key}].step", (), torch.float32)  # as torch.optim keeps it
        for moment in moments:
            tensor(st[moment], f"{path}.state[{key}].{moment}", shapes[key], torch.float32)


def check_env_state(v, path: str, cfg: C.Config, n: int) -> None:
    """A rank's env state, checked by the env's family (mpippo/envs/)."""
    envs.family(cfg).check_state(v, path, cfg, n, sys.modules[__name__])  # (this module's primitives)


def check_sync_rank(r, path: str, cfg: C.Config, obs_shape: tuple) -> None:
    n = cfg.env.num_envs_per_rank
    mapping(r, path, resume.RANK_STATE)
    rng = mapping(r["rng"], f"{path}.rng", resume.RANK_RNG)
    restores(f"{path}.rng.python", "Python random", lambda: random.Random().setstate(rng["python"]))
    restores(f"{path}.rng.numpy", "numpy RandomState", lambda: np.random.RandomState().set_state(rng["numpy"]))
    for key in ("torch", "shuffle"):
        tensor(rng[key], f"{path}.rng.{key}", None, torch.uint8)
        restores(f"{path}.rng.{key}", "torch generator", lambda: torch.Generator().set_state(rng[key]))
    need(rng["cuda"] is None or isinstance(rng["cuda"], torch.Tensor), f"{path}.rng.cuda", "expected a tensor or None")
    if rng.get("sampler") is not None:  # the device sampler's generator (CPU or CUDA: restored by the trainer)
        tensor(rng["sampler"], f"{path}.rng.sampler", None, torch.uint8)
    check_env_state(r["env"], f"{path}.env", cfg, n)
    array(r["obs"], f"{path}.obs", "u1" if len(obs_shape) == 3 else "f", (n, *obs_shape))
    array(r["first"], f"{path}.first", "b", (n,))
    for key in ("ret_tracker", "ep_ret"):
        array(r[key], f"{path}.{key}", "f", (n,))
    array(r["ep_len"], f"{path}.ep_len", "i", (n,))
    for i, x in enumerate(seq(r["win_returns"], f"{path}.win_returns")[:100]):
        num(x, f"{path}.win_returns[{i}]")
    int_(r["episodes_total"], f"{path}.episodes_total")
    array(r["interval_ep"], f"{path}.interval_ep", "f", (3,))
    array(r["interval_ev"], f"{path}.interval_ev", "f", (5,))


def check_ret_rms(v, path: str = "ret_rms") -> None:
    """A reward normalizer's running statistics (algos/buffers.RunningMeanStd)."""
    rms = mapping(v, path, ("mean", "var", "count"))
    num(rms["mean"], f"{path}.mean"), num(rms["var"], f"{path}.var", 0.0), num(rms["count"], f"{path}.count", 0.0)


# ---- what each layout's runner writes beside its algorithm's state (the algorithms check theirs:
# their `check_checkpoint`, handed to `validate`) ----
def check_sync_state(state: dict, cfg: C.Config) -> None:
    """The sync layout (runners/sync.py): the reward normalizer and every rank's state."""
    mapping(state, "checkpoint", ("ret_rms", "ranks"))
    check_ret_rms(state["ret_rms"])
    if cfg.training.normalize_obs:  # (older checkpoints and runs without it have none)
        obs_rms = mapping(state.get("obs_rms"), "obs_rms", ("mean", "var", "count"))
        dim = (state["model_spec"]["obs_shape"][0],)  # (meta_network checked the spec)
        array(obs_rms["mean"], "obs_rms.mean", "f", dim), array(obs_rms["var"], "obs_rms.var", "f", dim)
        need(bool(np.isfinite(obs_rms["mean"]).all() and (obs_rms["var"] >= 0).all()), "obs_rms",
             "non-finite mean or negative variance")
        num(obs_rms["count"], "obs_rms.count", 0.0)
    ranks = seq(state["ranks"], "ranks")
    need(len(ranks) <= MAX_WORLD, "ranks", f"{len(ranks)} entries")
    obs_shape = tuple(state["model_spec"]["obs_shape"])
    for i, r in enumerate(ranks):
        check_sync_rank(r, f"ranks[{i}]", cfg, obs_shape)


def check_learner(state: dict, net) -> None:  # the actor-learner layout (layout/learner.py)
    """What every actor-learner checkpoint has: agent, Adam over the network, counters, return window."""
    mapping(state, "checkpoint", ("agent", "counters", "ret_window"))
    int_(state["agent"], "agent")
    check_adam(state["optimizer"], "optimizer", [tuple(p.shape) for p in net.parameters()])
    counters = mapping(state["counters"], "counters", ("updates", "episodes", "transitions", "lag_sum", "lag_n"))
    for k, v in counters.items():
        int_(v, f"counters.{k}")
    if "resumes" in state:  # (checkpoints before 2026-12 lack it: 0 resumes)
        int_(state["resumes"], "resumes")
    for i, x in enumerate(seq(state["ret_window"], "ret_window")[:100]):
        num(x, f"ret_window[{i}]")


def torch_generator(v, path: str) -> None:
    """A CPU torch.Generator's state."""
    tensor(v, path, None, torch.uint8)
    restores(path, "torch generator", lambda: torch.Generator().set_state(v))


FORMAT = 2  # what today's writers write (`top_level`)


def _from_1(state: dict) -> dict:
    """Format 1 -> 2: the `format` key itself is new; nothing else moved."""
    return {**state, "format": 2}


UPGRADES = {1: _from_1}  # format n -> n + 1


def top_level(algo: str, model: dict, optimizer: dict, timesteps: int, iteration: int, config: dict,
              world_size: int, model_spec: dict) -> dict:
    """The keys every checkpoint has, whatever its layout (the layouts add theirs beside them)."""
    return {"format": FORMAT, "algo": algo, "model": model, "optimizer": optimizer, "timesteps": timesteps,
            "iteration": iteration, "config": config, "world_size": world_size, "model_spec": model_spec}


def upgrade(state: dict) -> dict:
    """An older checkpoint brought to FORMAT, step by step (Bad for a format this code does not know)."""
    fmt = state.get("format", 1)
    need(is_int(fmt) and 1 <= fmt, "format", f"expected an integer >= 1, got {show(fmt)}")
    need(fmt <= FORMAT, "format", f"{fmt} is newer than this mpippo reads (1 to {FORMAT}): use a newer mpippo")
    while fmt < FORMAT:
        state, fmt = UPGRADES[fmt](state), fmt + 1
    return state


def validate(state, where: str, classes: dict, algo: str | None = None) -> dict:
    """`state` (brought to today's format) if it is a complete mpippo checkpoint (of `algo`, when
    given), else UsageError naming the first problem. classes: {algorithm: its class}, whose
    `check_checkpoint` checks what that algorithm adds (algos/implementations.CLASSES)."""
    try:
        mapping(state, "checkpoint")
        state = upgrade(state)
        mapping(state, "checkpoint", ("algo", "model", "optimizer", "timesteps", "iteration", "config",
                                      "world_size", "model_spec"))
        need(state["algo"] in C.ALGOS, "algo", f"expected one of {', '.join(C.ALGOS)}, got {C.show(state['algo'])}")
        if algo is not None and state["algo"] != algo:
            raise C.UsageError(f"{where}: it is from algorithm '{state['algo']}', this run is {algo}")
        int_(state["timesteps"], "timesteps"), int_(state["iteration"], "iteration")
        int_(state["world_size"], "world_size", 1, MAX_WORLD)
        cfg = check_config(state)
        net = meta_network(state, cfg)
        check_weights(state["model"], "model", net)
        classes[state["algo"]].check_checkpoint(state, cfg, net)
    except Bad as e:
        raise C.UsageError(f"{where}: not a valid mpippo checkpoint: {e}") from None
    return state
