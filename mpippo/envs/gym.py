"""`gym:<id>`: any Gymnasium environment, registered ids and the user's own.

Each rank steps its batch in-process with Gymnasium's SyncVectorEnv (no subprocess: Open MPI does
not survive a fork after its start, so an asynchronous vector env is not offered). The vector env
resets an env in the step that ends its episode (autoreset mode SAME_STEP), which is the batch
interface's `first` flag: the observation returned is the new episode's, the previous one ended.
So no transition across an episode boundary exists to be trained on.

A time limit (truncation) is not the end of the task: `truncated()` hands the runner the final
observation of every env cut by one, and the runner bootstraps that step's reward with the value
of it (rewards += gamma * V(final_obs)), as Stable-Baselines3 does; a termination gets no value.
(CleanRL's PPO scripts treat both alike.)

User code runs only when the config names it: `env.import` (a module that registers its ids, or
`module:callable` that makes the env of `env.name`). Gymnasium's own `module:id` form of an id is
refused for the same reason: a saved config.yaml alone must never import anything.
"""
from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import math
import os
import re
import sys
import traceback
import warnings

import numpy as np

from mpippo.envs.family import EnvFamily, Spaces, a_flag, a_number, looks_channels_first, too_large
from mpippo.errors import EnvFailure, user_code_at, users_code, who
from mpippo.usage import UsageError, reason, show

PREFIX = "gym:"
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_KWARGS_CHARS = 4096  # env.kwargs are a few settings, not data


def kwargs_problem(kwargs: dict) -> str | None:
    """env.kwargs that no constructor can take: a key that is no keyword name, or more than settings."""
    bad = [k for k in kwargs if not (isinstance(k, str) and k.isidentifier())][:3]
    if bad:
        dotted = next((k for k in bad if isinstance(k, str) and "." in k), None)
        hint = "" if dotted is None else (f" (a nested value is given whole: --set env.kwargs.{dotted.split('.')[0]}="
                                          f"{{{dotted.split('.', 1)[1]}: ...}})")
        return f"env.kwargs: keys must be keyword names, got {bad}{hint}"
    if len(repr(kwargs)) > MAX_KWARGS_CHARS:
        return f"env.kwargs: {len(repr(kwargs)):,} characters; allowed: up to {MAX_KWARGS_CHARS:,}"
    if (key := next((k for k, v in kwargs.items() if _holds_nan(v)), None)) is not None:
        # (the checks of the rest of the config refuse NaN too; an env took it and failed at its first step)
        return (f"env.kwargs.{key}: {show(kwargs[key])[:80]} holds a NaN, which no setting of an env means; "
                f"allowed: values without NaN (.inf is taken)")
    return None


def _holds_nan(value) -> bool:
    """A float NaN in a kwargs value, lists and mappings included (small: kwargs_problem bounds them)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and v != v:
            return True
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return False


RESERVED = {"render_mode": "rgb_array for evaluate's videos, else none", "autoreset": "the vector env resets",
            "disable_env_checker": "the checker runs in the tests, not in every env"}  # gym.make's, ours


def env_id(name: str) -> str:
    return name[len(PREFIX):]


def _gym():
    import gymnasium
    return gymnasium


_UNDONE: list[str] = []  # what the user's code changed in this process and mpippo put back, not yet said


def undone() -> list[str]:
    """What the user's code (env.import's module, the envs' constructors) changed that mpippo put back
    since the last call, in words, for the trainer's warning."""
    said = list(dict.fromkeys(_UNDONE))
    _UNDONE.clear()
    return said


def _float32_default() -> None:
    """torch's default dtype back to float32 where the user's code changed it (torch.set_default_dtype:
    the network's weights became float64 and the update failed on a dtype mismatch, a traceback)."""
    torch = sys.modules.get("torch")  # (not imported here: the user's code did, if it is loaded)
    if torch is not None and torch.get_default_dtype() != torch.float32:
        _UNDONE.append(f"set torch's default dtype to {torch.get_default_dtype()}")
        torch.set_default_dtype(torch.float32)


def _user_import(spec: str, env_name: str) -> None:
    """env.import: the module (its import registers ids), or module:callable registered under
    env.name's id. One line on any failure: the user's module raised, or is not there."""
    module, _, attr = spec.partition(":")
    try:
        with users_code():
            mod = importlib.import_module(module)
        _float32_default()
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's code may raise anything on import, or exit:
        # its code would have ended the run in silence, 0 or the requeue's 3 included)
        raise UsageError(f"env.import: importing '{module}' failed ({_why(e, 160)})") from None
    if not attr:
        return
    make = getattr(mod, attr, None)
    if not callable(make):
        raise UsageError(f"env.import: '{module}' has no callable '{attr}' (module:callable names a function or "
                         f"class that returns a gymnasium.Env)")
    gym, eid = _gym(), env_id(env_name)
    known = gym.envs.registry.get(eid)
    if known is not None and known.entry_point is not make:
        raise UsageError(f"env.name: '{eid}' is already a registered Gymnasium id; give the env of "
                         f"env.import '{spec}' a name of its own")
    if known is None:
        try:
            gym.register(id=eid, entry_point=make)
        except Exception as e:  # noqa: BLE001 (Gymnasium's id rules: gymnasium.error.Error)
            raise UsageError(f"env.name: '{eid[:80]}' cannot name the env of env.import '{spec}' "
                             f"({str(e).splitlines()[0][:200]})") from None


def _check_syntax(cfg) -> list[str]:
    e, errs = cfg.env, []
    eid = env_id(e.name)
    if not eid or ":" in eid or len(eid) > 200 or not eid.isprintable():
        errs.append(f"env.name: '{e.name[:80]}' is not gym:<id> with a Gymnasium id such as gym:CartPole-v1 (a "
                    f"module to import goes in env.import, not in the id)")
    if e.imports is not None:
        module, colon, attr = e.imports.partition(":")
        if not MODULE.match(module) or (colon and not attr.isidentifier()):
            errs.append(f"env.import: '{e.imports[:80]}' is not a module (mypackage.envs) or module:callable")
    if (problem := kwargs_problem(e.kwargs)) is not None:
        errs.append(problem)
    for key in RESERVED:
        if key in e.kwargs:
            errs.append(f"env.kwargs.{key}: set by mpippo ({RESERVED[key]}); remove it")
    steps = e.kwargs.get("max_episode_steps")  # gym.make's own (no constructor default to check it by): True was 1
    if steps is not None and (type(steps) is not int or steps < 1):
        errs.append(f"env.kwargs.max_episode_steps: {show(steps)} is not a whole number of steps; allowed: 1 or more "
                    f"(or none: the id's own limit)")
    return errs


def _spaces_of(env) -> Spaces:
    """The batch interface's spaces of a gymnasium env, or one line naming what is not supported."""
    gym = _gym()
    ob, ac = env.observation_space, env.action_space
    box_actions = isinstance(ac, gym.spaces.Box) and len(ac.shape) == 1 and 0 < ac.shape[0] <= 1024
    if not (isinstance(ac, gym.spaces.Discrete) or box_actions):
        raise UsageError(f"env.name: the action space {_space(ac)} is not supported; allowed: Discrete, or Box of "
                         f"shape (A,) (continuous)")
    if not isinstance(ob, gym.spaces.Box) or len(ob.shape) not in (1, 3) or 0 in ob.shape:
        raise UsageError(f"env.name: the observation space {_space(ob)} is not supported; allowed: Box of shape (D,) "
                         f"(a vector) or (H, W, C) of uint8 (an image)")
    if len(ob.shape) == 3 and ob.dtype != np.uint8:
        raise UsageError(f"env.name: the image observation space {_space(ob)} is not uint8; allowed: uint8 images "
                         f"(H, W, C), or vectors (D,)")
    if len(ob.shape) == 3 and looks_channels_first(ob.shape):
        raise UsageError(f"env.name: the image observation space {_space(ob)} looks channels-first (C, H, W); "
                         f"allowed: channels-last images (H, W, C), as Gymnasium's and ALE's (transpose them in "
                         f"your env: np.transpose(obs, (1, 2, 0)))")
    obs_shape, obs_dtype = tuple(int(d) for d in ob.shape), "uint8" if len(ob.shape) == 3 else "float32"
    if (large := too_large(obs_shape, int(ac.n) if not box_actions else int(ac.shape[0]))):
        raise UsageError(f"env.name: {large}: more than a network here is built for")
    if not box_actions:
        return Spaces(obs_shape, obs_dtype, int(ac.n))
    if len(obs_shape) == 3:
        raise UsageError(f"env.name: Box actions {_space(ac)} with image observations are not supported; allowed: "
                         f"Box actions with vector observations (the MLP)")
    if not np.issubdtype(ac.dtype, np.floating):  # (a Gaussian's draws are not whole numbers: the env would get 0.64)
        raise UsageError(f"env.name: the action space {_space(ac)} holds {ac.dtype} values; allowed: Discrete, or a "
                         f"Box of floats (continuous)")
    return Spaces(obs_shape, obs_dtype, int(ac.shape[0]), True, tuple(map(float, ac.low)), tuple(map(float, ac.high)))


def _space(space) -> str:
    return str(space)[:120]


def unknown_id(eid: str, prefix: str = "gym:") -> str | None:
    """Why `eid` is not a Gymnasium id one can make here (with the closest one, as `prefix` + id), or
    None if it is."""
    registry = _gym().envs.registry
    if eid in registry:
        return None
    near = difflib.get_close_matches(eid, list(registry), n=1)
    hint = f" (did you mean '{prefix}{near[0]}'?)" if near else ""
    game = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v\d+|([A-Za-z0-9]+)NoFrameskip-v4", eid)
    if game:  # ale-py's own ids: the Atari family has the games, with the preprocessing they need
        hint = f" (Atari games are atari:<Game>: did you mean 'atari:{game.group(1) or game.group(2)}'?)"
    return f"'{eid}' is not a registered Gymnasium id{hint}"


class GymFamily(EnvFamily):
    name = "gymnasium"
    exact_resume = False  # a Gymnasium env's state cannot be saved in general: episodes start fresh
    static_spaces = False  # Gymnasium states spaces on a made env only
    keys = ("kwargs", "imports")

    def __init__(self):
        self._spaces: dict = {}

    def accepts(self, name: str) -> bool:
        return isinstance(name, str) and name.startswith(PREFIX)

    def acting_kwargs(self, name: str, kwargs: dict) -> dict:
        """Left out: entries equal to what gym.make passes anyway (the id's registered kwargs, else the
        constructor's default; an int for a float default, as the kwargs' check takes it); all kept where
        the id or its constructor cannot be read."""
        gym, eid = _gym(), env_id(name)
        if (spec := gym.envs.registry.get(eid)) is None or (params := _constructor_params(gym, spec)) is None:
            return dict(kwargs)
        anyway = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        anyway |= dict(spec.kwargs or {}) | {"max_episode_steps": spec.max_episode_steps}
        return {k: v for k, v in kwargs.items() if not (k in anyway and _same_value(v, anyway[k]))}

    def allowed(self) -> str:
        return "gym:<id> (a Gymnasium id, e.g. gym:CartPole-v1)"

    def check(self, cfg) -> list[str]:
        errs = _check_syntax(cfg)
        if errs:
            return errs
        try:
            gym = _gym()
        except ImportError as e:
            return [f"env.name: '{cfg.env.name}' needs the gymnasium package, which does not import ({e})"]
        try:
            if cfg.env.imports is not None:
                _user_import(cfg.env.imports, cfg.env.name)
        except UsageError as e:
            return e.errors
        unknown = unknown_id(env_id(cfg.env.name))
        if unknown:
            return [f"env.name: {unknown}; your own env: name its module in env.import"]
        try:
            _check_kwarg_types(gym, env_id(cfg.env.name), cfg.env.kwargs)  # once, before any env is made
            self.spaces(cfg)
        except UsageError as e:
            return e.errors
        return []

    def spaces(self, cfg) -> Spaces:
        key = (cfg.env.name, repr(sorted(cfg.env.kwargs.items())))
        if key not in self._spaces:  # Gymnasium states spaces on an env only: make one, once per process
            env = _make_one(cfg)
            try:
                self._spaces[key] = _spaces_of(env)
            except UsageError:
                raise
            except Exception as e:  # noqa: BLE001 (the user's env: no observation_space, a property that raises)
                raise UsageError(f"env.name: '{cfg.env.name}': its spaces cannot be read ({reason(e)}); allowed: a "
                                 f"gymnasium.Env with observation_space and action_space") from None
            finally:
                _close(env)  # (a close that fails is said when the run's own envs close)
        return self._spaces[key]

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        return GymVecEnv(cfg, num_envs, seed, self.spaces(cfg), render)

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        need = schema.need
        need(v is None, path, "expected none (a Gymnasium env's state is not saved)")


_MUJOCO_SEEN: set[str] | None = None  # MuJoCo's warnings said so far (None: its handler is not set yet)
_QUIET = False  # a rank other than 0 during start-up (quiet_start_up)


def quiet_start_up(quiet: bool) -> None:
    """Start-up makes the config's env on every rank from the same files, so MuJoCo warns every rank of
    the same thing (Gymnasium's HalfCheetah XML: a deprecated attribute): ranks other than 0 keep those
    warnings to themselves until start-up ends (the trainer's start-up calls this with True on them,
    then False). Afterwards each rank says its own (an unstable simulation is one env's)."""
    global _QUIET
    _QUIET = quiet


def _mujoco_warnings_to_stderr(eid: str, render: bool) -> None:
    """MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory (a file left in the
    user's folder by every run): for a MuJoCo env they go to stderr instead, each message once per
    process (the handler is set once). MuJoCo's import reads MUJOCO_GL (a cluster's often says
    osmesa): a backend it cannot load is one line naming it. (Without mujoco, gym.make says so.)"""
    global _MUJOCO_SEEN
    spec = _gym().envs.registry.get(eid)
    if spec is None or "mujoco" not in str(spec.entry_point):
        return
    if render:
        _glfw_context_without_display()
    if _MUJOCO_SEEN is not None:
        return
    try:
        import mujoco
    except Exception as e:  # noqa: BLE001 (its GL backend's import may raise anything)
        if os.environ.get("MUJOCO_GL") is None:
            return
        raise UsageError(f"MUJOCO_GL={show(os.environ['MUJOCO_GL'])[:40]}: MuJoCo's import failed with it for "
                         f"'{eid}' ({reason(e, 120)}); allowed: unset (training renders nothing), or egl, osmesa or "
                         f"glfw where that library is installed") from None
    _MUJOCO_SEEN = seen = set()

    def warn(message: str) -> None:
        if message not in seen and not _QUIET:  # (kept quiet: not seen, so said if it comes again after start-up)
            seen.add(message)
            print(f"mpippo: warning: MuJoCo: {message.strip()}", file=sys.stderr, flush=True)
    mujoco.set_mju_user_warning(warn)


def _glfw_context_without_display() -> None:
    """Gymnasium's MuJoCo renderer tries GLFW first where MUJOCO_GL is unset; without a display no
    window is made, and MuJoCo's GLContext, left without its `_context`, prints two tracebacks from
    its destructor at the process's end: a class default of None makes that destructor do nothing."""
    try:
        from mujoco import glfw as mujoco_glfw
    except Exception:  # noqa: BLE001 (no glfw here: nothing to mend)
        return
    if not hasattr(mujoco_glfw.GLContext, "_context"):
        mujoco_glfw.GLContext._context = None


def _make_one(cfg, render: bool = False):
    """One env of the config, or one line naming what went wrong (the user's kwargs or code)."""
    gym, kwargs = _gym(), dict(cfg.env.kwargs)
    _mujoco_warnings_to_stderr(env_id(cfg.env.name), render)
    if render:
        kwargs["render_mode"] = "rgb_array"
    with warnings.catch_warnings(record=True) as said:  # (Gymnasium's, e.g. that the id is out of date)
        warnings.simplefilter("always")
        try:
            with users_code():
                env = gym.make(env_id(cfg.env.name), disable_env_checker=True, **kwargs)
        except (Exception, SystemExit) as e:  # noqa: BLE001 (an env's constructor may raise anything, or exit)
            warned = "".join(f"; it warned: {_plain(w.message)}" for w in said[:1])
            if render and "render_mode" in str(e):  # (--video's keyword, not the user's kwargs)
                raise UsageError(f"--video: making '{env_id(cfg.env.name)}' with render_mode='rgb_array' failed "
                                 f"({_why(e)}); allowed: an env whose constructor takes render_mode (Gymnasium's "
                                 f"rendering API)") from None
            raise UsageError(f"env.name: making '{env_id(cfg.env.name)}' with env.kwargs {_kw(cfg.env.kwargs)} "
                             f"failed ({_why(e)}){warned}") from None
    for w in said:  # a refusal is one line (above); an env that was made says what it warned of, as before
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    _float32_default()
    return env


# a YAML scalar of another type than the constructor's default is a typo Python would take silently
# ('maybe' is a true bool, "5" a frame_skip that fails deep in the env): bool is no int here, an int is a float
_KINDS = {bool: ((bool,), "true or false"), int: ((int,), "a whole number"), float: ((int, float), "a number"),
          str: ((str,), "text")}


def _check_kwarg_types(gym, eid: str, kwargs: dict) -> None:
    """Each entry of env.kwargs whose constructor parameter has a plain default (a bool, int, float or
    str) must be of that type; others (None, containers, **kwargs) are the env's to judge."""
    spec = gym.envs.registry.get(eid)
    if not kwargs or spec is None or (params := _constructor_params(gym, spec)) is None:
        return  # (an unknown id, or no constructor to read: gym.make names what is wrong)
    for key, value in kwargs.items():
        default = params[key].default if key in params else None
        kinds, what = _KINDS.get(type(default), (None, ""))
        if kinds and not (isinstance(value, kinds) and (type(value) is bool) == (type(default) is bool)):
            raise UsageError(f"env.kwargs.{key}: {show(value)} is not {what}, as {eid}'s default ({default!r}) is")


def _constructor_params(gym, spec):
    """The parameters of a registered id's constructor, or None where they cannot be read (no signature,
    or a module that does not import: gym.make names it)."""
    try:
        entry = spec.entry_point if callable(spec.entry_point) else gym.envs.registration.load_env_creator(
            spec.entry_point)
        return inspect.signature(entry).parameters
    except Exception:  # noqa: BLE001 (the user's module may raise anything on import)
        return None


def _same_value(given, default) -> bool:
    """A kwarg given at what the env takes anyway: equal, and a bool only for a bool (an int for a float
    is the same number); values that cannot be compared plainly (numpy arrays in a default) are not."""
    try:
        return bool(given == default) and (type(given) is bool) == (type(default) is bool)
    except Exception:  # noqa: BLE001 (an array's ambiguous truth, a user object's __eq__)
        return False


def _plain(message) -> str:
    """A warning's first line without Gymnasium's colour codes and 'WARN: ' prefix."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(message)).strip()
    return text.removeprefix("WARN: ").splitlines()[0][:200] if text else ""


def _what(e: BaseException) -> str:
    return f"called sys.exit({show(e.code)})" if isinstance(e, SystemExit) else f"raised {reason(e)}"


def _why(e: BaseException, limit: int = 200) -> str:
    """What the user's code did at start-up, for a refusal: 'called sys.exit(3)', or what it raised."""
    return _what(e) if isinstance(e, SystemExit) else reason(e, limit)


def _where(e: BaseException) -> str:
    """Where the env's own code failed (errors.user_code_at)."""
    return user_code_at(traceback.extract_tb(e.__traceback__))


def _kw(kwargs: dict) -> str:
    text = repr(kwargs)
    return text if len(text) <= 80 else text[:77] + "..."


@functools.cache
def _info_dropped():
    """A wrapper that gives the vector env empty info dicts: mpippo reads none of an env's own info (the
    final observation of a cut episode is the vector env's), and Gymnasium's merging of them into arrays
    fails on a value whose shape differs between envs (a path's length), which the one-env API allows.
    It also names an older API's reset (the observation alone) as what it is."""
    gym = _gym()

    class InfoDropped(gym.Wrapper):
        def reset(self, **kwargs):
            out = self.env.reset(**kwargs)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(f"its reset() returned {type(out).__name__} {show(out)[:60]}, not (obs, info)")
            return out[0], {}

        def step(self, action):
            obs, reward, terminated, truncated, _ = self.env.step(action)
            if not (a_number(reward) and a_flag(terminated) and a_flag(truncated)):  # (every step: one test)
                raise next(BadReturn(what, value) for what, value, fits in (
                    ("a reward", reward, a_number), ("terminated", terminated, a_flag), ("truncated", truncated, a_flag))
                    if not fits(value))
            return obs, reward, terminated, truncated, {}
    return InfoDropped


class BadReturn(Exception):
    """A value of an env's step() that Gymnasium's vector env would turn into another without a word (a
    reward of None or "1.0" into NaN or 1.0 in its float array, a terminated of None into False)."""

    def __init__(self, what: str, value):
        super().__init__(f"{what} of {show(value)[:60]} ({type(value).__name__})")
        self.allowed = ("a number (an int, a float, a numpy or torch scalar)" if what == "a reward" else
                        "True or False (a bool, a numpy or torch bool, 0 or 1)")


class GymVecEnv:
    """num_envs Gymnasium envs behind the batch interface (observe/act, `first` flags), plus
    `truncated()`: the envs a time limit cut at the last act, with their final observations."""

    def __init__(self, cfg, num_envs: int, seed: int, spaces: Spaces, render: bool = False):
        gym = _gym()
        self.num_envs, self.obs_shape, self.num_actions = num_envs, spaces.obs_shape, spaces.num_actions
        self.spaces = spaces
        self.dtype = np.uint8 if spaces.obs_dtype == "uint8" else np.float32
        first_env = _make_one(cfg, render)  # (one line if it fails; the rest are made alike)
        declared = _space(first_env.observation_space)  # (as made: an env may swap its spaces in its reset)
        dropped = _info_dropped()
        fns = [lambda e=first_env: dropped(e)] + [lambda: dropped(_make_one(cfg, render))] * (num_envs - 1)
        self.continuous = spaces.continuous
        try:  # the user's env meets its own spaces here first: one line, not a traceback from deep in Gymnasium
            self.env = gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
            with users_code():
                obs, _ = self.env.reset(seed=[int(seed) + i for i in range(num_envs)])
            with np.errstate(over="ignore"):  # (past float32's range: said below, as the env returned it)
                self.obs = self._cast(obs)
        except UsageError:
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 (the env's code may raise anything, or exit)
            _close(getattr(self, "env", None) or first_env)  # the envs made so far
            raise UsageError(f"env.name: '{cfg.env.name}': making {num_envs} and resetting them failed ({_why(e)}); "
                             f"allowed: envs whose reset(seed=..., options=...) returns (obs, info), each with the "
                             f"spaces of the first, its observations of the shape of {declared} (as it declared "
                             f"them when made)") from None
        self.name, self.steps = cfg.env.name, 0
        try:  # (the steps' check, for reset's)
            self._check_finite("an observation", self.obs, obs)
        except EnvFailure as e:
            _close(self.env)
            raise UsageError(str(e).replace(" at step 0 of this rank", " from its reset()")) from None
        self.start = 0 if spaces.continuous else int(self.env.single_action_space.start)
        # Box actions are clipped in the space's own dtype: float32's 0.1 is above a float64 bound of 0.1
        self.act_dtype = self.env.single_action_space.dtype if spaces.continuous else np.int64
        self.low, self.high = (np.array(spaces.low, self.act_dtype), np.array(spaces.high, self.act_dtype))
        self.declared = f"observations {_space(first_env.observation_space)}, actions {_space(first_env.action_space)}"
        self.env.single_action_space.seed(int(seed))
        self.rew = np.zeros(num_envs, dtype=np.float32)
        self.first = np.ones(num_envs, dtype=bool)
        self.cut = (np.zeros(0, dtype=np.int64), np.zeros((0, *self.obs_shape), dtype=self.dtype))

    def _cast(self, obs) -> np.ndarray:
        return np.asarray(obs, dtype=self.dtype).reshape(self.num_envs, *self.obs_shape)

    def observe(self):
        return self.rew, self.obs, self.first

    def act(self, actions: np.ndarray) -> None:
        if self.continuous:  # the Gaussian's draw, clipped to the bounds for the env only (its log-prob is the draw's)
            actions = np.clip(np.asarray(actions, dtype=self.act_dtype), self.low, self.high)
        else:
            actions = np.asarray(actions, dtype=np.int64) + self.start
        self.steps += 1
        try:  # the user's code: whatever it raises (sys.exit too) becomes one line naming the env
            returned = obs, rew, term, trunc, info = self.env.step(actions)
            first = np.logical_or(term, trunc)
            cut = np.flatnonzero(np.logical_and(trunc, np.logical_not(term)))
            finals = [info["final_obs"][i] for i in cut]
            with np.errstate(over="ignore"):  # (a value past float32's range is said below, as the env returned it)
                obs, rew = self._cast(obs), np.asarray(rew, dtype=np.float32).reshape(self.num_envs)
                final = (np.stack([np.asarray(f, dtype=self.dtype).reshape(self.obs_shape) for f in finals])
                         if len(cut) else np.zeros((0, *self.obs_shape), dtype=self.dtype))
        except BadReturn as e:
            raise EnvFailure(f"env.name: '{self.name}' returned {e} at step {self.steps:,} of this rank; allowed: "
                             f"{e.allowed}") from None
        except (Exception, SystemExit, GeneratorExit) as e:  # noqa: BLE001 (not KeyboardInterrupt: a person's Ctrl-C)
            raise self._failed("step", e, "an env whose step returns (obs, reward, terminated, truncated, info) "
                               f"within its declared spaces ({self.declared})") from None
        self._check_finite("a reward", rew, returned[1])  # a NaN would surface updates later as a non-finite loss
        self._check_finite("an observation", obs, returned[0])
        self._check_finite("a final observation", final, finals)
        self.obs, self.rew, self.first, self.cut = obs, rew, first, (cut, final)

    def _failed(self, during: str, e: BaseException, allowed: str) -> EnvFailure:
        return EnvFailure(f"env.name: '{self.name}' {_what(e)} in its {during}() (step {self.steps:,} of this rank)"
                          f"{_where(e)}; allowed: {allowed}")

    def _check_finite(self, what: str, values: np.ndarray, returned=None) -> None:
        """No NaN or inf in `values` (float32, as trained on); one there that the env `returned` finite
        was past float32's range (1e39), said as the env gave it."""
        if (bad := _nonfinite(values)) is None:
            return
        was = _returned_at(returned, int(np.flatnonzero(~np.isfinite(values))[0]))
        if was is not None and math.isfinite(was):
            raise EnvFailure(f"env.name: '{self.name}' returned {what} of {was:.6g} at step {self.steps:,} of this rank, "
                             f"past float32's range; allowed: values within +-3.4e38")
        raise EnvFailure(f"env.name: '{self.name}' returned {what} holding {bad} (as float32) at step "
                         f"{self.steps:,} of this rank; allowed: finite values")

    def truncated(self) -> tuple[np.ndarray, np.ndarray]:
        """(env indices, their final observations) of the episodes the last act cut by a time limit."""
        return self.cut

    def render(self) -> np.ndarray:
        try:
            return self.env.envs[0].render()
        except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's renderer)
            raise self._failed("render", e, "a picture from render() with render_mode='rgb_array'") from None

    def get_state(self):
        return None  # not exact_resume: a resume starts fresh episodes

    def set_state(self, state) -> None:
        raise ValueError("a Gymnasium env's state cannot be restored")

    def close(self) -> None:
        if (e := _close(self.env)) is not None:  # at the end, the run's results written: a warning, not a failure
            sys.stderr.write(f"mpippo: warning: {who()}env.name: '{self.name}' {_what(e)} in its close(){_where(e)}; "
                             "ignored\n")


def _returned_at(returned, i: int) -> float | None:
    """Element i of what an env returned, flattened, as a float64 (None where it has none)."""
    try:
        return float(np.asarray(returned, dtype=np.float64).reshape(-1)[i])
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _nonfinite(values: np.ndarray):
    """The first NaN or inf of a float array, or None."""
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        return values[~np.isfinite(values)].flat[0]
    return None


def _close(env) -> BaseException | None:
    """Close the user's env(s); what the close raised, if anything."""
    try:
        with users_code():
            env.close()
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's code)
        return e
    return None


FAMILY = GymFamily()
