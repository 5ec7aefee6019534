"""What the rest of mpippo asks of an env family (one module each under mpippo/envs/, listed in
`envs.FAMILIES`): its names, its config checks, its spaces, `make`, how its state resumes.

The trainers, the checkpoint checks, resume and evaluate ask the family of `env.name` instead of
branching on names, so a new family is one module and one line in `envs.FAMILIES`. Nothing here
imports an env's package: `spaces` and `make` do, when a job asks for that family.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from mpippo.usage import UsageError


def _one_value(x):
    """x as a numpy array of one element, or None: text, None and what numpy holds as objects are none
    (an env's reward may be any scalar that converts: numpy's, torch's, jax's)."""
    if x is None or isinstance(x, (str, bytes)):
        return None
    try:
        a = np.asarray(x)
    except Exception:  # noqa: BLE001 (whatever the object's __array__ raises: not a number)
        return None
    return a if a.size == 1 and a.dtype.kind in "biuf" else None


def a_number(x) -> bool:
    """An env's reward as Gymnasium's vector env takes it without a word: one int, float or bool (None and
    "1.0" it turns into NaN and 1.0). Called on every step: the usual kinds first."""
    return (isinstance(x, (float, int, np.floating, np.integer, np.bool_)) or isinstance(x, numbers.Real)  # (Fraction)
            or _one_value(x) is not None)


def a_flag(x) -> bool:
    """An episode's end (terminated, truncated): true or false, 0 or 1, no float, no None (read as false)."""
    if isinstance(x, (bool, np.bool_)):
        return True
    a = _one_value(x)
    return a is not None and a.dtype.kind in "biu" and a.item() in (0, 1)


@dataclass(frozen=True)
class Spaces:
    """An env's observation and action spaces, as the networks and buffers need them.

    obs_shape: (H, W, C) for images (uint8, the CNNs), (D,) for vectors (float32, the MLP).
    num_actions: the policy's outputs: the choices of a Discrete action space, or the dimensions of
    a Box one (continuous: a Gaussian's means; low/high: its bounds, the actions clipped to them)."""
    obs_shape: tuple[int, ...]
    obs_dtype: str  # "uint8" | "float32"
    num_actions: int
    continuous: bool = False
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    @property
    def image(self) -> bool:
        return len(self.obs_shape) == 3

    def bounds_off_zero(self) -> str | None:
        """Box actions with a dimension whose bounds leave 0 outside or on an edge (the Gaussian's first
        mean): those bounds as [low, high], in words; else None."""
        off = [(lo, hi) for lo, hi in zip(self.low, self.high) if not lo < 0.0 < hi]
        return None if not (self.continuous and off) else (
            ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in off[:3]) + (f" (and {len(off) - 3} more)" if len(off) > 3 else ""))


# The largest spaces a network is built for (a checkpoint's model_spec is checked against the same, ckpt_schema)
MAX_ACTIONS = 1024      # choices of a Discrete action space, or dimensions of a Box one
MAX_VECTOR = 1 << 20    # a vector observation's length
MAX_SIDE = 4096         # each side (and the channels) of an image observation


def too_large(obs_shape, num_actions: int) -> str | None:
    """What of these spaces is past the networks' bounds above, in words; None if nothing is."""
    if num_actions > MAX_ACTIONS:
        return f"{num_actions:,} actions (allowed: up to {MAX_ACTIONS:,})"
    limit = MAX_VECTOR if len(obs_shape) == 1 else MAX_SIDE
    if max(obs_shape) > limit:
        return f"observations of shape {tuple(obs_shape)} (allowed: each dimension up to {limit:,})"
    return None


def looks_channels_first(shape) -> bool:
    """An image shape (H, W, C) that reads as (C, H, W): (12, 84, 84) or (4, 10, 10); no picture is 12 pixels
    high with 84 channels, nor 4 high with 10, while a board of 16 planes (4, 7, 16) is one, and stays."""
    c, h, w = shape
    return c < min(h, w) and (min(h, w) >= 16 or h == w)


def obs_dtype(obs_shape) -> str:
    """The dtype observations of this shape are stored and sent in: uint8 images (the CNNs scale
    them), float32 vectors (the MLPs)."""
    return "uint8" if len(obs_shape) == 3 else "float32"


def take_rows(parts: list, lo: int, hi: int):
    """Rows lo..hi-1 of `parts` (arrays or lists, one per old rank) joined in order, copying only
    the parts that hold them (a job of many ranks takes a few rows each)."""
    import numpy as np
    pieces, start = [], 0
    for part in parts:
        a, b = max(lo - start, 0), min(hi - start, len(part))
        if a < b:
            pieces.append(part[a:b])
        start += len(part)
    if pieces and isinstance(pieces[0], np.ndarray):
        return np.concatenate(pieces)
    return [x for piece in pieces for x in piece]


class EnvFamily:
    """The contract of an env family; a family overrides what differs from these defaults."""

    name = ""            # the family, as messages and docs name it
    exact_resume = True  # its envs save and restore their state: a resume continues every episode
    static_spaces = True  # `spaces` answers without making an env (checkpoint checks compare with it)
    two_player = False   # an opponent moves inside `act` (self-play, evaluate --opponent)
    mirror_symmetric = False  # the rules are left-right symmetric (dqn.mirror_augment)
    keys: tuple[str, ...] = ()  # the EnvConfig fields it reads beyond name and the env counts

    def accepts(self, name: str) -> bool:
        raise NotImplementedError

    def canonical(self, name: str) -> str:
        """The one spelling config.yaml keeps."""
        return name

    def allowed(self) -> str:
        """Its names, for the message that refuses an unknown one."""
        raise NotImplementedError

    def known_names(self) -> tuple[str, ...]:
        """Names to suggest for a misspelling (difflib)."""
        return ()

    def check(self, cfg) -> list[str]:
        """One line per bad value of the family's own keys (cfg.env); run before any env is made."""
        return []

    def spaces(self, cfg) -> Spaces:
        raise NotImplementedError

    def acting_kwargs(self, name: str, kwargs: dict) -> dict:
        """env.kwargs as they act on env `name`: an entry set to what the env takes anyway is left out, so
        that a resume naming a default is the same job (families that know their defaults say them)."""
        return dict(kwargs)

    def held_out(self, cfg) -> list[str]:
        """Move cfg's env (in place) to levels its training never saw (evaluate --levels test), and say
        what the reader should know; a family without levels refuses (the usage module's UsageError)."""
        raise UsageError(f"--levels: '{cfg.env.name}' has no levels to hold out; allowed: train (the default)")

    def picture(self, frame):
        """An observation as the RGB picture a video records: pictures are themselves (a two-player
        family draws its board's planes)."""
        return frame

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        """`num_envs` envs in one batch object (the interface of mpippo/envs/__init__.py). render: a
        video will be made (a family whose observations are no pictures renders one: `render()`)."""
        raise NotImplementedError

    def reshard(self, states: list, lo: int, hi: int, seed: int):
        """Envs lo..hi-1 of the old ranks' env states joined in rank order, as one rank's env state
        (a resume on another world size); only called when exact_resume."""
        raise NotImplementedError

    def score_range(self, name: str, mode: str) -> tuple[float, float] | None:
        """(low, high) of the published scale a suite normalizes the env's returns on, (R - low) /
        (high - low); None: no published scale (its returns are reported, not aggregated). mode:
        the suite's distribution_mode (Procgen's constants differ by mode)."""
        return None

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        """A checkpoint's env state of n envs, checked before any env sees it, with the checking
        primitives of `schema` (mpippo.ckpt_schema, passed in: the envs are the bottom layer and
        import nothing above them); the first problem raises schema.Bad."""
        raise NotImplementedError

    # Two-player games (two_player) also answer these, for self-play and evaluate --opponent:
    def symmetric(self, name: str) -> bool:
        """Whether the rules of `name` are left-right symmetric (dqn.mirror_augment)."""
        return self.mirror_symmetric

    def heuristics(self, name: str) -> tuple[str, ...]:
        """The fixed players of the game (self-play's heuristic opponents and rating games)."""
        return ()

    def heuristic(self, name: str, which: str, rng):
        """One of them: a policy (obs, mask) -> actions."""
        raise NotImplementedError

    def play_games(self, cfg, policy, opponent, num_games: int, seed: int):
        """(wins, draws, losses) of `policy` against `opponent` over num_games games, seats alternating."""
        raise NotImplementedError


class ArrayStateFamily(EnvFamily):
    """A built-in numpy env of one name (toy-cue, connect4): its state is one array row per env
    (the class's PER_ENV keys) and one RNG for all its envs."""
    env_name = ""

    def env_class(self):
        raise NotImplementedError

    def accepts(self, name: str) -> bool:
        return name == self.env_name

    def allowed(self) -> str:
        return self.env_name

    def known_names(self) -> tuple[str, ...]:
        return (self.env_name,)

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        return self.env_class()(num_envs, seed=seed)

    def reshard(self, states: list, lo: int, hi: int, seed: int):
        """The rows continue; the one RNG of a rank's envs cannot be split: seeded anew from `seed`."""
        import numpy as np
        state = {k: take_rows([s[k] for s in states], lo, hi) for k in self.env_class().PER_ENV}
        state["rng"] = np.random.default_rng(seed).bit_generator.state
        return state
