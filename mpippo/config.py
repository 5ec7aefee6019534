"""Typed configuration: YAML file + CLI overrides -> validated `Config`.

Every field carries its help text in `metadata["help"]`; `python -m mpippo.config`
prints them all. `validate()` collects *all* errors at once, each one line naming the
bad value and what is allowed, so a user fixes a config in one round trip.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from mpippo.algos import registry
from mpippo import envs
from mpippo.envs import canonical_env_name  # noqa: F401 (a name of config)
from mpippo.netshape import NATURE_LAYERS, nature_out
from mpippo.rules import envs_per_rank, frame_bytes, obs_shape_of, show  # the checks' kit, below the registry
from mpippo.usage import UsageError

ALGOS = registry.NAMES  # training.algo: one registry entry each (mpippo/algos/registry.py)
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "ppo_procgen.yaml"

INT64_MAX = 2**63 - 1
MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; anything near this is not one


_f = registry.setting  # a key: its default and help
FILE_KEYS = {("env", "imports"): "import"}  # fields whose key in a config file is a Python keyword


def file_key(section: str, name: str) -> str:
    """A field's key as config files, --set and messages spell it."""
    return FILE_KEYS.get((section, name), name)


@dataclass
class EnvConfig:
    name: str = _f(envs.DEFAULT_ENV, "The env, by family (mpippo/envs/): a Procgen game (`coinrun` or `procgen-coinrun-v0`); the built-in test env `toy-cue`; `connect4` (two-player: against the random player, or a self-play pool with selfplay.enabled; actions masked to legal columns in DQN); `gym:<id>`, any Gymnasium id (`gym:CartPole-v1`), the user's own with env.import; `pz:connect_four_v3`, PettingZoo's Connect Four (two-player, as connect4); `atari:<Game>`, an ALE game (`atari:Breakout`) with the standard preprocessing.")
    kwargs: dict = _f({}, "gym:<id>: keyword arguments of gymnasium.make (e.g. {max_episode_steps: 200}); atari:<Game>: repeat_action_probability (0.0), full_action_space (false), noop_max (30), max_episode_steps (27000), episodic_life (true), reward_clip (true).")
    imports: Optional[str] = _f(None, "gym:<id> only (the key is `import`): the user's module to import first, which registers the id (`mypackage.envs`), or `module:callable` returning a gymnasium.Env, registered as env.name's id. Runs the user's code: only ever imported when a config or command line names it.")
    distribution_mode: str = _f("easy", "Procgen difficulty: easy | hard | extreme | memory | exploration (procgen's own default is hard).")
    num_levels: int = _f(0, "Number of distinct training levels; 0 = unlimited.")
    start_level: int = _f(0, "First level seed of the training set.")
    num_envs: int = _f(64, "Environments over ALL ranks (strong scaling), divided over the ranks; when they do not divide, rounded up to the next multiple of the rank count (the start-up line says so), so the job runs on any core count.")
    num_envs_per_rank: Optional[int] = _f(None, "Environments per rank (weak scaling). When set, it wins over num_envs.")
    num_threads: Optional[int] = _f(None, "Procgen's stepping threads per rank; null = auto: 0 (step in the rank's own thread) on a CPU rank, whose cores train; the rank's CPU share on a GPU rank, whose cores are free for the envs.")


@dataclass
class ParallelConfig:
    threads_per_rank: int = _f(0, "torch threads per rank; 0 = auto (OMP_NUM_THREADS, else SLURM_CPUS_PER_TASK, else cores / ranks on the node).")
    expected_world_size: Optional[int] = _f(None, "Fail unless the job has exactly this many ranks (the Slurm scripts pass SLURM_NTASKS); null = any.")


@dataclass
class GuardsConfig:
    collective_timeout_s: float = _f(600.0, "Abort the job when one collective waits longer than this (watchdog); 0 = off.")
    max_nonfinite_skips: int = _f(3, "Abort after this many consecutive optimizer steps skipped for NaN/Inf on any rank.")
    checksum_interval: int = _f(10, "Compare parameter checksums across ranks at the first iteration end after this many updates, and at the end.")


@dataclass
class ModelConfig:
    arch: str = _f("impala", "The network for image observations: impala (the IMPALA-CNN of model.channels, the Procgen paper's) | nature (the Nature DQN's three convolutions and a dense layer of model.hidden_size: the Atari network of CleanRL and Ape-X; model.channels and model.downsample are the IMPALA-CNN's only).")
    channels: list = _f([16, 32, 32], "IMPALA-CNN conv channels, one entry per stage.")
    hidden_size: int = _f(256, "Width of the dense layer after the conv stack.")
    downsample: bool = _f(True, "Max-pool by 2 in every conv stage (IMPALA); false keeps full resolution, for small boards (connect4). DQN only.")
    mlp_sizes: list = _f([64, 64], "Hidden layers of the MLP used for vector observations (gym:<id> envs whose observation is a Box of shape (D,)): separate policy and value networks of this shape with tanh, as CleanRL's.")
    init: str = _f("glorot", "Initial weights of the conv stack and the dense layer: glorot (Glorot-uniform weights, zero biases: TensorFlow's defaults, which the Procgen paper's IMPALA-CNN had; chosen on the mini suite: docs/parity.md) | torch (PyTorch's defaults: Kaiming-uniform weights, small uniform biases) | orthogonal (gain sqrt(2), zero biases: CleanRL's, its Atari network's). The policy and value heads are orthogonal either way.")


@dataclass
class TrainingConfig:
    algo: str = _f("ppo", registry.help_text())
    total_timesteps: int = _f(25_000_000, "Env steps over all ranks; the run ends when reached (or at duration_hours).")
    duration_hours: Optional[float] = _f(None, "Wall-clock budget in hours (timed training); null = none.")
    seed: int = _f(1, "Base seed; rank r uses derived seeds, so a run is reproducible for a given seed and world size.")
    n_steps: int = _f(256, "Steps per env per rollout. batch_size = num_envs * n_steps.")
    rollout_cutoff: Optional[float] = _f(None, "The balanced cut-off (sync layout): every rank's rollout ends once this fraction of the ranks has collected its n_steps, so a slow rank no longer sets the pace; it keeps the steps it has (at least rollout_min_fraction of n_steps), its part of every minibatch shrinks with them and the gradient average is weighted by sample count (the update is that of one process holding every rank's samples). Runs then depend on the ranks' timing (replicas stay identical). null = off: every rank collects n_steps.")
    rollout_min_fraction: float = _f(0.25, "With rollout_cutoff: the least fraction of n_steps a rank collects before it may be cut off.")
    n_epochs: int = _f(3, "Passes over the rollout per update.")
    num_minibatches: int = _f(8, "Minibatches per epoch (global); each rank splits its share of the batch into this many.")
    learning_rate: float = _f(5e-4, "Adam learning rate.")
    anneal_lr: bool = _f(False, "Linearly anneal the learning rate to 0 over total_timesteps (DQN: over the transitions received, to 2% of it).")
    adam_eps: float = _f(1e-5, "Adam epsilon.")
    gamma: float = _f(0.999, "Discount factor.")
    gae_lambda: float = _f(0.95, "GAE lambda.")
    clip_range: float = _f(0.2, "PPO ratio clip.")
    clip_vloss: bool = _f(True, "Clip the value loss around the old values (as ppo2).")
    ent_coef: float = _f(0.01, "Entropy bonus coefficient.")
    vf_coef: float = _f(0.5, "Value loss coefficient.")
    max_grad_norm: float = _f(0.5, "Clip gradients by this global norm (after the Allreduce).")
    target_kl: Optional[float] = _f(None, "Stop the epochs early when the global approx_kl exceeds this; null = off.")
    norm_adv: bool = _f(True, "Normalize advantages (to mean 0, std 1) before the loss; where: adv_norm.")
    adv_norm: str = _f("minibatch", "minibatch: each global minibatch by its own mean and std (all ranks' shares; one 3-number Allreduce per minibatch), as ppo2 and CleanRL | rollout: once over the whole rollout.")
    normalize_reward: bool = _f(True, "Scale rewards by a running std of discounted returns, shared by all ranks (as the Procgen paper); how: reward_norm.")
    reward_norm: str = _f("step", "step: the running std is updated every env step with every rank's envs and each step's rewards are scaled by the statistics up to that step, as baselines' VecNormalize (one Allreduce of 3 x n_steps numbers per rollout) | rollout: updated once per rollout, which then is scaled as a whole.")
    reward_norm_gamma: Optional[float] = _f(None, "The discount of the returns whose running std scales the rewards; null = gamma. The Procgen paper's runs used 0.99 here while learning with 0.999 (baselines' VecNormalize keeps its own default, 0.99, unless given one).")
    normalize_obs: bool = _f(False, "Vector observations (gym:<id>): normalize each dimension by the running mean and std of every rank's observations (updated once per rollout, one Allreduce), then clip to +-obs_clip, as the reference PPO for continuous control; saved in checkpoints and applied by evaluate.")
    obs_clip: float = _f(10.0, "With normalize_obs: the bound of the normalized observations.")
    device: str = _f("cpu", "cpu | cuda | auto. cuda picks the GPU from the local rank.")
    deterministic: bool = _f(True, "On a GPU: deterministic cuDNN and cuBLAS kernels, so that a resumed run continues bit for bit (the default kernels sum in a varying order: measured on an H100, a resume drifted by 2e-3 within 4 updates); false: the fastest kernels. CPU runs are deterministic either way.")
    precision: str = _f("auto", "auto | fp32 | bf16. bf16 runs the network's forward and backward under autocast; parameters, optimizer and losses stay fp32. auto: bf16 where the hardware computes it natively (CPU flag avx512_bf16 or amx_bf16, GPU compute capability >= 8.0; for sync PPO on every rank), else fp32; fp32 for vector observations (their MLPs are too small for bf16 to pay). The start-up line, config.yaml and benchmark_metrics.json say which ran and why.")
    cuda_graph: bool = _f(True, "On a GPU: the rollout's policy step (forward, action, log-prob, value) is captured once as a CUDA graph and replayed: one launch per env step instead of about 80 kernels dispatched from Python; the same actions as eager (the noise is drawn outside the graph). false, the CPU, or a capture that fails or whose replay differs from the eager step (one warning): eager. The start-up line and benchmark_metrics.json (policy_step) say which ran.")

    def norm_gamma(self) -> float:
        """The discount of the returns that the reward normalizer tracks."""
        return self.gamma if self.reward_norm_gamma is None else self.reward_norm_gamma


@dataclass
class SelfPlayConfig:
    enabled: bool = _f(False, "Self-play (DQN on connect4): actors play frozen snapshots of the learner from an opponent pool instead of the random player.")
    snapshot_interval_updates: int = _f(200, "Learner updates between snapshots added to the pool (the starting network is member 0).")
    pool_size: int = _f(8, "Most members kept in the pool (and cached on each actor); beyond it one is dropped, never the newest.")
    sampling: str = _f("uniform", "Opponent per actor game: latest | uniform | prioritized (by the learner's recent loss rate against each member).")
    drop: str = _f("oldest", "Member dropped when the pool is full: oldest | lowest_rated.")
    priority_exponent: float = _f(1.0, "prioritized: p ~ loss_rate ** this (larger = focus on the members the learner loses to).")
    opponent_eps: float = _f(0.05, "Pool members play a random legal column at this rate (else greedy), so no game is one fixed line.")
    heuristic_prob: float = _f(0.1, "Share of actor games against the fixed random / one-step-lookahead players (half each).")
    elo_k: float = _f(16.0, "Elo K-factor of the ratings (learner, members, heuristics; random is the anchor at 0).")
    eval_interval_updates: int = _f(250, "Learner updates between greedy rating games against the heuristic players (the win-rate curve); 0 = only at start and end.")
    eval_games: int = _f(100, "Greedy games against each heuristic player per rating round (half with the first move).")


@dataclass
class LoggingConfig:
    log_interval: int = _f(1, "Iterations between metric reductions, TensorBoard points and benchmark_metrics.json writes.")
    print_interval: int = _f(5, "Iterations between console lines (rank 0); the actor-learner layout: a line every "
                                "print_interval x 5 s.")
    tensorboard: bool = _f(True, "Write TensorBoard event files to <output_dir>/logs.")
    wandb: str = _f("off", "Weights & Biases: off | offline (the run under <output_dir>/wandb/, for `wandb sync`) | "
                           "online (needs the wandb package and a login); the same scalars as TensorBoard.")
    wandb_project: str = _f("mpippo", "The W&B project of logging.wandb.")
    progress: bool = _f(True, "Show a progress bar on rank 0.")


@dataclass
class CheckpointConfig:
    interval_iterations: int = _f(50, "PPO: save every this many iterations; 0 = off (a checkpoint is always written at the end). DQN: see dqn.checkpoint_interval_updates.")
    interval_minutes: float = _f(30.0, "Also save when this many minutes passed since the last save; 0 = off.")
    keep_last: int = _f(3, "Periodic checkpoints kept (latest.pt is always kept).")


class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    # (here: the sections that registry entries bring, each algorithm's own; added below)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def to_dict(self) -> dict:
        """The config as config.yaml spells it (file keys, FILE_KEYS)."""
        out = dataclasses.asdict(self)
        for (section, name), key in FILE_KEYS.items():
            out[section] = {(key if k == name else k): v for k, v in out[section].items()}
        return out


def _with_algorithm_sections(cls):
    """Config with a section per registry entry that brings one (each declared beside its algorithm),
    after the training section, so that a new algorithm adds its settings without an edit here."""
    names = list(cls.__annotations__)
    after = names.index("training") + 1
    extra = {name: tp for name, tp in registry.sections()}
    cls.__annotations__ = {**{n: cls.__annotations__[n] for n in names[:after]}, **extra,
                           **{n: cls.__annotations__[n] for n in names[after:]}}
    for name, tp in extra.items():
        setattr(cls, name, field(default_factory=tp))
    return dataclass(cls)


Config = _with_algorithm_sections(Config)


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


def _section_classes() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {name: hints[name] for name in SECTIONS}


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_name(args[0])} or null"
    if tp in (list, dict):
        return "list" if tp is list else "mapping"
    return tp.__name__


def _coerce(value: Any, tp, where: str) -> Any:
    """Check `value` against the annotated type; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _coerce(value, inner, where)
    if tp is float and isinstance(value, str):
        try:  # PyYAML reads 3e-4 (no dot) as a string; users mean a float
            value = float(value)
        except ValueError:
            pass
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
        list: lambda v: isinstance(v, list),
        dict: lambda v: isinstance(v, dict),
    }[tp](value)
    if not ok:
        raise UsageError(f"{where}: expected {_type_name(tp)}, got {show(value)} ({type(value).__name__})")
    if tp is float and not math.isfinite(value):  # NaN passes every `<` check below; refuse it here
        raise UsageError(f"{where}: must be a finite number, got {value}")
    if tp in (int, float) and abs(value) > INT64_MAX:  # counters and seeds end up in int64 arrays
        allowed = "below 2**63" if tp is int else "magnitudes below 9.2e18 (2**63)"
        raise UsageError(f"{where}: {show(value)} is out of range; allowed: {allowed}")
    return float(value) if tp is float else value


def _closest(name, allowed) -> str:
    near = difflib.get_close_matches(str(name), list(allowed), n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


WANDB_MODES = ("off", "offline", "online")  # logging.wandb (metrics/sinks.py)
OFF_STRINGS = {("logging", "wandb"): WANDB_MODES}  # string keys with an "off" value: their words


# Keys whose built-in default changed: a run's saved config.yaml that lacks one was written by code
# that predates the key, and that code ran the earlier value. Add a key here whenever its default changes.
EARLIER_DEFAULTS = {("model", "init"): "torch"}  # glorot since the mini suite's decision


# Keys that guard one launch and are no part of a run: resolve() leaves them out of config.yaml,
# and a config.yaml written before it did loses them on reading (or a resume on another allocation
# would be refused by the guard of the first launch).
LAUNCH_ONLY = {("parallel", "expected_world_size")}


def with_earlier_defaults(data):
    """A run's saved config (nested dicts) with the values its code ran for keys it predates, and
    without the launch-only keys older code saved; anything that is not a mapping is left for
    from_dict to refuse."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for section, key in LAUNCH_ONLY:
        if isinstance(out.get(section), dict) and key in out[section]:
            out[section] = {k: v for k, v in out[section].items() if k != key}
    for (section, key), value in EARLIER_DEFAULTS.items():
        keys = out.get(section)
        if keys is None or (isinstance(keys, dict) and key not in keys):  # a damaged section stays as it is
            out[section] = {**(keys or {}), key: value}
    return out


def check_saved_imports(data, overrides: list) -> None:
    """A run folder's config.yaml never imports by itself: its env.import (the user's code) runs on
    a resume only when the command line names the same module (UsageError otherwise)."""
    env = data.get("env") if isinstance(data, dict) else None
    saved = env.get("import") if isinstance(env, dict) else None
    if saved is None:
        return
    named = [v for sec, key, v in overrides if (sec, key) == ("env", "import")]
    if not named or named[-1] != saved:
        raise UsageError(f"--resume: the run's config.yaml has env.import {show(saved)}, the user's code, which is "
                         f"imported only when named: add --set env.import={show(saved)[1:-1] if isinstance(saved, str) else saved}")


def from_dict(data: dict, errors: list[str]) -> Config:
    """Build a Config from nested dicts; unknown keys and type errors go to `errors`."""
    cfg = Config()
    classes = _section_classes()
    if not isinstance(data, dict):
        errors.append(f"config: top level must be a mapping of sections {sorted(SECTIONS)}, got {type(data).__name__}")
        return cfg
    for sec_name, sec_data in data.items():
        if sec_name not in classes:
            errors.append(f"unknown section {show(sec_name)}{_closest(sec_name, classes)}; allowed: {', '.join(classes)}")
            continue
        if sec_data is None:
            continue
        if not isinstance(sec_data, dict):
            errors.append(f"section '{sec_name}' must be a mapping of keys, got {show(sec_data)} "
                          f"({type(sec_data).__name__})")
            continue
        section = getattr(cfg, sec_name)
        fields = {file_key(sec_name, k): k for k in typing.get_type_hints(classes[sec_name])}
        hints = {key: typing.get_type_hints(classes[sec_name])[name] for key, name in fields.items()}
        for key, value in sec_data.items():
            if key not in hints:
                name = key[:60] if isinstance(key, str) else show(key)
                errors.append(f"unknown key '{sec_name}.{name}'{_closest(key, hints)}; allowed: {', '.join(hints)}")
                continue
            if hints[key] is str and isinstance(value, bool) and (sec_name, key) in OFF_STRINGS:
                if value is True:  # YAML 1.1 reads a bare on/yes/true as true: which word was meant is unknown
                    errors.append(f"{sec_name}.{key}: YAML reads a bare on/yes/true as true, not a word; write one "
                                  f"of {', '.join(OFF_STRINGS[sec_name, key])}")
                    continue
                value = "off"  # ... and a bare `off` as false; here it is the word
            try:
                setattr(section, fields[key], _coerce(value, hints[key], f"{sec_name}.{key}"))
            except UsageError as e:
                errors.extend(e.errors)
    return cfg


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (PyYAML keeps
    the last one silently, so a forgotten earlier line would win without a word)."""


def _strict_mapping(loader, node, deep=False):
    first_line = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            seen = first_line.get(key)
        except TypeError:  # an unhashable key: construct_mapping below says so
            continue
        if seen is not None:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {show(key)} (first given at line {seen})",
                                                    key_node.start_mark)
        first_line[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


def _read_text(path: Path) -> str:
    """The file's text, or one UsageError line naming the path and what is wrong with it."""
    try:
        if path.is_dir():
            raise UsageError(f"config file: '{path}' is a folder; give a YAML file")
        if not path.is_file():
            raise UsageError(f"config file not found: '{path}'")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UsageError(f"config file '{path}' has {path.stat().st_size:,} bytes; a config is a small YAML "
                              f"file (at most {MAX_CONFIG_BYTES:,} bytes)")
        raw = path.read_bytes()
    except OSError as e:  # permissions, a name too long, an I/O error
        raise UsageError(f"config file '{show(str(path))}': cannot read it ({e.strerror or e})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"config file '{path}' is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                          f"save it as UTF-8") from None


def load_yaml(path: str | Path) -> dict:
    """A config file as nested dicts: UTF-8 YAML whose top level is a mapping of sections."""
    path = Path(path)
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds only plain data
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"malformed YAML in '{path}'{where}: {problem}") from None
    except RecursionError:
        raise UsageError(f"malformed YAML in '{path}': nested too deeply") from None
    if data is None:  # an empty file: every default
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file '{path}': the top level must be a mapping of sections ({', '.join(SECTIONS)}), "
                          f"got {show(data)} ({type(data).__name__})")
    return data


def parse_override(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, YAML-typed value)."""
    if "=" not in item or "." not in item.split("=", 1)[0]:
        raise UsageError(f"--set expects section.key=value, got '{item}'")
    dotted, raw = item.split("=", 1)
    section, key = dotted.split(".", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return section, key, value


def merge_overrides(data: dict, overrides: list[tuple[str, str, Any]]) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (data or {}).items()}
    for section, key, value in overrides:
        sec = data.get(section)
        if sec is None:
            sec = data[section] = {}
        if isinstance(sec, dict):  # a section that is not a mapping stays as it is: from_dict reports it
            sec[key] = value
    return data


def validate(cfg: Config, world_size: int = 1) -> list[str]:
    """All problems with `cfg` for a job of `world_size` ranks, each one line."""
    errs = _check_choices(cfg) + _check_ranges(cfg)
    p = cfg.parallel
    if p.expected_world_size is not None and p.expected_world_size < 1:
        errs.append(f"parallel.expected_world_size: must be a number of ranks >= 1 (the tasks the job was given), or "
                    f"null for any; got {show(p.expected_world_size)}")
    elif p.expected_world_size is not None and p.expected_world_size != world_size:
        errs.append(f"parallel.expected_world_size: {p.expected_world_size} tasks were allocated but this job has "
                    f"{world_size} rank(s); the launcher started separate jobs (use mpirun, or srun --mpi=pmix)")
    if cfg.training.algo not in ALGOS:  # said by _check_choices
        return errs
    return errs + algorithm(cfg).check(cfg, world_size, errs)


def algorithm(cfg: Config) -> registry.Algorithm:
    """The registry entry of the run's training.algo."""
    return registry.get(cfg.training.algo)


def actor_learner(cfg: Config) -> bool:
    """Whether the run's algorithm runs in the actor-learner layout (else: synchronous replicas)."""
    return algorithm(cfg).layout == registry.ACTOR_LEARNER


def sync_minibatches(cfg: Config) -> tuple[str, int]:
    """The sync layout's minibatches per update: (the key that sets them, their number)."""
    key = algorithm(cfg).minibatches_key
    section, name = key.split(".")
    return key, getattr(getattr(cfg, section), name)


def _check_choices(cfg: Config) -> list[str]:
    """Names and modes: env, algorithm, precision, normalization, device, the network's initial weights."""
    errs: list[str] = []
    e, t = cfg.env, cfg.training

    errs += _check_env(cfg)
    if e.num_threads is not None and not 0 <= e.num_threads <= 1024:
        errs.append(f"env.num_threads: must be null (auto) or in [0, 1024], got {e.num_threads}")
    if t.algo not in ALGOS:
        errs.append(f"training.algo: '{t.algo}' is not supported; allowed: {', '.join(ALGOS)}")
    selfplay_algos = [a.name for a in registry.ALGORITHMS.values() if a.selfplay]
    if cfg.selfplay.enabled and t.algo not in selfplay_algos:
        errs.append(f"selfplay.enabled: self-play runs in the DQN learner layout, training.algo is '{t.algo}'; "
                    f"allowed: {', '.join(selfplay_algos)}")
    if t.precision not in ("auto", "fp32", "bf16"):
        errs.append(f"training.precision: '{t.precision}' is not one of auto, fp32, bf16")
    if t.adv_norm not in ("minibatch", "rollout"):
        errs.append(f"training.adv_norm: '{t.adv_norm}' is not one of minibatch, rollout")
    if t.reward_norm not in ("step", "rollout"):
        errs.append(f"training.reward_norm: '{t.reward_norm}' is not one of step, rollout")
    if t.device not in ("cpu", "cuda", "auto"):
        errs.append(f"training.device: '{t.device}' is not one of cpu, cuda, auto")
    if cfg.model.init not in INITS:
        errs.append(f"model.init: {show(cfg.model.init)} is not one of {', '.join(INITS)}")
    if cfg.model.arch not in ARCHS:
        errs.append(f"model.arch: {show(cfg.model.arch)} is not one of {', '.join(ARCHS)}")
    elif cfg.model.arch == "nature":
        errs += [f"model.{k}: {show(getattr(cfg.model, k))} is read by model.arch impala only (nature is a fixed "
                 f"stack of convolutions): remove it" for k in ("channels", "downsample")
                 if getattr(cfg.model, k) != getattr(ModelConfig(), k)]
    errs += _check_wandb(cfg.logging)

    return errs


def _check_env(cfg: Config) -> list[str]:
    """env.name names a family (mpippo/envs/), which checks its own keys; another family's keys
    left at their defaults (a key set for one family and ignored by the next would mislead)."""
    e = cfg.env
    fam = envs.family_of(e.name)
    if fam is None:
        return [f"env.name: unknown environment {show(e.name)}{_closest(e.name, envs.known_env_names())}; "
                f"allowed: {envs.allowed_env_names()}"]
    errs = [f"env.{file_key('env', k)}: {show(getattr(e, k))} is read by "
            f"{', '.join(f.name for f in envs.FAMILIES if k in f.keys)} envs only; env.name {show(e.name)} is of "
            f"the {fam.name} family: remove it" for k in ("kwargs", "imports")
            if getattr(e, k) != getattr(EnvConfig(), k) and k not in fam.keys]
    if errs or (errs := fam.check(cfg)):
        return errs
    t = cfg.training
    if t.algo in ALGOS and not algorithm(cfg).continuous and fam.spaces(cfg).continuous:
        return [f"training.algo: '{t.algo}' takes discrete actions, {e.name} has continuous (Box) ones; allowed "
                f"with {e.name}: {', '.join(a.name for a in registry.ALGORITHMS.values() if a.continuous)}"]
    if not t.obs_clip > 0:
        errs.append(f"training.obs_clip: must be > 0, got {show(t.obs_clip)}")
    shape = fam.spaces(cfg).obs_shape
    if t.normalize_obs and len(shape) != 1:
        errs.append(f"training.normalize_obs: {e.name} has image observations; allowed: true for vector "
                    f"observations only (images are scaled to [0, 1] by the network)")
    if cfg.model.arch == "nature" and (len(shape) != 3 or min(nature_out(*shape[:2])) < 1):
        errs.append(f"model.arch: nature takes frames of at least 36x36 (its 8x8/4, 4x4/2 and 3x3 convolutions); "
                    f"{e.name} observes {'x'.join(map(str, shape))}; allowed there: impala")
    return errs


def wandb_missing() -> bool:
    import importlib.util
    return importlib.util.find_spec("wandb") is None


def _check_wandb(lg) -> list[str]:
    if lg.wandb not in WANDB_MODES:
        return [f"logging.wandb: {show(lg.wandb)} is not one of {', '.join(WANDB_MODES)}"]
    if lg.wandb != "off" and wandb_missing():
        return [f"logging.wandb: '{lg.wandb}' needs the wandb package (pip install wandb); or logging.wandb=off"]
    bad = sorted(set(WANDB_PROJECT_FORBIDDEN) & set(lg.wandb_project))
    if not lg.wandb_project.strip() or len(lg.wandb_project) > 128 or bad:
        return [f"logging.wandb_project: {show(lg.wandb_project)} is not a W&B project name: 1 to 128 characters, "
                f"none of {' '.join(WANDB_PROJECT_FORBIDDEN)}" + (f" (it has {' '.join(bad)})" if bad else "")]
    return []


WANDB_PROJECT_FORBIDDEN = "/\\#?%:"  # what W&B refuses in a project name (wandb.init says so)


def _check_ranges(cfg: Config) -> list[str]:
    """Numbers: positive, in [0, 1], non-negative; model shape."""
    errs: list[str] = []
    e, t, lg, ck, m, p = cfg.env, cfg.training, cfg.logging, cfg.checkpoint, cfg.model, cfg.parallel
    positive = {
        "training.total_timesteps": t.total_timesteps, "training.n_steps": t.n_steps,
        "training.n_epochs": t.n_epochs, "training.num_minibatches": t.num_minibatches,
        "training.learning_rate": t.learning_rate, "training.adam_eps": t.adam_eps,
        "training.clip_range": t.clip_range, "training.max_grad_norm": t.max_grad_norm,
        "logging.log_interval": lg.log_interval, "logging.print_interval": lg.print_interval,
        "guards.checksum_interval": cfg.guards.checksum_interval,
        "guards.max_nonfinite_skips": cfg.guards.max_nonfinite_skips, "model.hidden_size": m.hidden_size,
        "checkpoint.keep_last": ck.keep_last,
    }
    if e.num_envs_per_rank is None:
        positive["env.num_envs"] = e.num_envs
    else:
        positive["env.num_envs_per_rank"] = e.num_envs_per_rank
    for key, val in positive.items():
        if not val > 0 or (isinstance(val, float) and not math.isfinite(val)):
            errs.append(f"{key}: must be > 0, got {val}")
    unit = {"training.gamma": t.gamma, "training.gae_lambda": t.gae_lambda}
    if t.reward_norm_gamma is not None:
        unit["training.reward_norm_gamma"] = t.reward_norm_gamma
    for key, val in unit.items():
        if not 0.0 <= val <= 1.0:
            errs.append(f"{key}: must be in [0, 1], got {val}")
    for key, val in {"training.ent_coef": t.ent_coef, "training.vf_coef": t.vf_coef,
                     "checkpoint.interval_iterations": ck.interval_iterations,
                     "checkpoint.interval_minutes": ck.interval_minutes,
                     "parallel.threads_per_rank": p.threads_per_rank,
                     "guards.collective_timeout_s": cfg.guards.collective_timeout_s}.items():
        if val < 0:
            errs.append(f"{key}: must be >= 0, got {val}")
    if t.duration_hours is not None and not t.duration_hours > 0:
        errs.append(f"training.duration_hours: must be > 0 or null, got {t.duration_hours}")
    if t.target_kl is not None and not t.target_kl > 0:
        errs.append(f"training.target_kl: must be > 0 or null, got {t.target_kl}")
    if t.rollout_cutoff is not None and not 0 < t.rollout_cutoff <= 1:
        errs.append(f"training.rollout_cutoff: must be in (0, 1] (a fraction of the ranks) or null, got {t.rollout_cutoff}")
    if not 0 < t.rollout_min_fraction <= 1:
        errs.append(f"training.rollout_min_fraction: must be in (0, 1], got {t.rollout_min_fraction}")
    if not m.downsample and t.algo in ALGOS and algorithm(cfg).network != "q":
        errs.append(f"model.downsample: false is for the DQN network (small boards); training.algo is '{t.algo}'")
    if not m.channels or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in m.channels):
        errs.append(f"model.channels: must be a non-empty list of positive ints, got {show(m.channels)}")

    return errs


def stepping_ranks(cfg: Config, world_size: int) -> int:
    """Ranks that step envs: all of them in the sync layout (PPO, A2C); the actors in the
    actor-learner layout (DQN, APPO: learners step none)."""
    if not actor_learner(cfg):
        return world_size
    return max(world_size - layout_section(cfg).num_agents, 1)


def layout_section(cfg: Config):
    """The actor-learner layout's settings of this run's algorithm (its section: dqn, appo):
    num_agents, chunk_size, max_inflight, weight_sync_period, checkpoint_interval_updates. None
    in the sync layout."""
    return getattr(cfg, algorithm(cfg).section) if actor_learner(cfg) else None


def agent_folder(run_dir, agent: int, num_agents: int) -> Path:
    """Agent `agent`'s folder of a run: the run folder itself, or agent_<k>/ of a multi-agent job."""
    return Path(run_dir) / f"agent_{agent}" if num_agents > 1 else Path(run_dir)


def local_num_envs(cfg: Config, world_size: int) -> int:
    """Envs per rank (PPO) or per actor (DQN): env.num_envs over the ranks that step envs, rounded up."""
    return envs_per_rank(cfg, stepping_ranks(cfg, world_size))


def envs_note(asked: Config, ran: Config, world_size: int) -> str | None:
    """Why the envs that run differ from the env.num_envs asked for (None when they do not)."""
    if asked.env.num_envs_per_rank is not None or asked.env.num_envs == ran.env.num_envs:
        return None
    return (f"env.num_envs {asked.env.num_envs} does not divide over {stepping_ranks(asked, world_size)} env-stepping "
            f"rank(s): {ran.env.num_envs_per_rank} per rank, {ran.env.num_envs} in all")


def ignored_note(cfg: Config) -> str | None:
    """One line naming the keys set away from their defaults that `cfg`'s algorithm does not read:
    the shared keys its registry entry lists and the sections of the other algorithms (None: none)."""
    entry, default = registry.get(cfg.training.algo), Config()
    keys = list(entry.ignores)
    for section in registry.algorithm_sections():
        if section != entry.section:
            keys += [f"{section}.{k}" for k in getattr(default, section).__dataclass_fields__]
    unread = []
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value != getattr(getattr(default, section), name):
            unread.append(f"{key}={show(value)}")
    if not unread:
        return None
    return (f"training.algo {entry.name} does not read {', '.join(unread)}: these settings have no effect "
            f"(docs/config.md lists the keys each algorithm reads)")


def resolve(cfg: Config, world_size: int) -> Config:
    """Fill derived values so the saved config.yaml states what actually ran."""
    # parallel.expected_world_size guards one launch (validate checked it) and is no part of the
    # run: kept in config.yaml, it would refuse a resume from that file on another allocation
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env),
                              parallel=dataclasses.replace(cfg.parallel, expected_world_size=None))
    per_rank = local_num_envs(cfg, world_size)
    cfg.env.num_envs_per_rank = per_rank
    cfg.env.num_envs = per_rank * stepping_ranks(cfg, world_size)
    cfg.env.name = canonical_env_name(cfg.env.name)
    return cfg


INITS = ("glorot", "torch", "orthogonal")
ARCHS = ("impala", "nature")


def network_params(obs_shape, channels, hidden_size: int, num_actions: int = 15, downsample: bool = True,
                   arch: str = "impala") -> int:
    """Parameters of the image network, by arithmetic. impala (models/impala_cnn.py): per stage a
    conv and two residual blocks of two 3x3 convs, then the dense layer and two heads (626,256 for
    the default); nature (models/nature_cnn.py): three convs, the dense layer, two heads."""
    h, w, c = obs_shape
    if arch == "nature":
        n = 0
        for ch, k, _ in NATURE_LAYERS:
            n, c = n + k * k * c * ch + ch, ch
        oh, ow = nature_out(h, w)
        return n + (c * oh * ow + 1) * hidden_size + (hidden_size + 1) * (num_actions + 1)
    n = 0
    for ch in channels:
        n += 9 * c * ch + ch + 4 * (9 * ch * ch + ch)
        c = ch
        if downsample:
            h, w = (h + 1) // 2, (w + 1) // 2
    return n + (c * h * w + 1) * hidden_size + (hidden_size + 1) * (num_actions + 1)


def first_conv_bytes(obs_shape, m) -> int:
    """Bytes of the first conv's float32 output per sample (kept for backward): the memory models'."""
    h, w, _ = obs_shape
    if m.arch == "nature":
        ch, k, st = NATURE_LAYERS[0]
        return ((h - k) // st + 1) * ((w - k) // st + 1) * ch * 4
    return h * w * m.channels[0] * 4


def mlp_params(obs_dim: int, sizes, num_actions: int, kind: str = "actor_critic") -> int:
    """Parameters of an MLP of models/mlp.py: the actor-critic's policy and value networks of `sizes`,
    or (kind q) the Q-network's one stack and its dueling head."""
    def layers(widths):
        return sum((a + 1) * b for a, b in zip(widths, widths[1:]))
    if kind == "q":
        return layers([obs_dim, *sizes, num_actions + 1])
    return layers([obs_dim, *sizes, num_actions]) + layers([obs_dim, *sizes, 1])


def memory_floor(cfg: Config, world_size: int) -> tuple[int, str]:
    """A lower bound of one env-stepping rank's memory in bytes, and what it is made of. A lower
    bound (the real peak is several times larger: docs/performance.md), so it never refuses a job
    that would fit; it catches the sizes that would only end in an allocation failure. In the
    actor-learner layout (dqn, appo) this is an actor; `layout_memory` has the learner too."""
    m, t = cfg.model, cfg.training
    if actor_learner(cfg):
        parts = layout_memory(cfg, world_size)[1]
        return sum(b for b, _, _ in parts), ", ".join(what for _, what, _ in parts)
    sp = envs.spaces_of(cfg)
    n_envs = local_num_envs(cfg, world_size)
    if sp.image:
        params = network_params(sp.obs_shape, m.channels, m.hidden_size, sp.num_actions, m.downsample, m.arch)
        first_act = first_conv_bytes(sp.obs_shape, m)  # float32 output of the first conv, kept for backward
    else:
        params = mlp_params(sp.obs_shape[0], m.mlp_sizes, sp.num_actions)
        first_act = 2 * sum(m.mlp_sizes) * 4  # both networks' hidden activations
    obs_bytes = frame_bytes(sp.obs_shape)
    # observations + six float32/int64 fields per step; one minibatch's first activations
    steps = t.n_steps
    rollout, minibatch = steps * n_envs * (obs_bytes + 32), max(steps * n_envs // sync_minibatches(cfg)[1], 1)
    need = 16 * params + rollout + minibatch * first_act  # params: weights, gradients, two Adam moments
    return need, (f"network {params:,} parameters, {n_envs:,} envs x {steps:,} steps of {obs_bytes:,}-byte "
                  f"observations, minibatch {minibatch:,} samples")


def chunk_bytes(cfg: Config, world_size: int) -> int:
    """One actor -> learner message (comm/p2p.ChunkLayout), by arithmetic: the header, self-play's
    result rows, the episode-return slots and chunk_size items (DQN: transitions of two frames;
    APPO: segments of T+1 frames)."""
    rows = cfg.selfplay.pool_size + 4 if _selfplay_rows(cfg) else 0
    capacity, items = algorithm(cfg).chunk_items(cfg, world_size)
    return 64 + 32 * rows + 8 * capacity + items


def _selfplay_rows(cfg: Config) -> bool:
    """Whether the messages carry self-play's game results (selfplay on, and the algorithm has it)."""
    return cfg.selfplay.enabled and algorithm(cfg).selfplay


@dataclass(frozen=True)
class LayoutSizes:
    """What every actor-learner memory model is made of: a frame, one sample's forward pass, the
    network's parameters and an actor's envs (bytes, counts); the keys that size the network."""
    frame: int
    fwd: int
    params: int
    envs: int
    net_keys: str = "model.hidden_size, model.channels"


def layout_memory(cfg: Config, world_size: int) -> tuple[list, list]:
    """Lower bounds of a learner's and of an actor's memory in the actor-learner layout, as parts
    [(bytes, what, the keys that size it)]: what is allocated for certain (buffers, network copies,
    one forward pass), never the allocator's or the framework's overhead. The messages' parts are
    the layout's; the rest is the algorithm's (its registry entry's `memory`)."""
    m, sp, section = cfg.model, cfg.selfplay, algorithm(cfg).section
    sec = layout_section(cfg)
    obs_shape = obs_shape_of(cfg)
    frame, elems = frame_bytes(obs_shape), math.prod(obs_shape)
    if len(obs_shape) == 3:  # per sample: the float input and the first conv's output
        fwd, net_keys = 4 * elems + first_conv_bytes(obs_shape, m), "model.hidden_size, model.channels"
        params = network_params(obs_shape, m.channels, m.hidden_size, downsample=m.downsample, arch=m.arch)
    else:  # vectors: the input and the MLPs' hidden activations (an actor-critic's two towers at most)
        fwd, net_keys = 4 * elems + 2 * sum(m.mlp_sizes) * 4, "model.mlp_sizes"
        params = mlp_params(elems, m.mlp_sizes, envs.spaces_of(cfg).num_actions, algorithm(cfg).network)
    actors, n_envs = world_size // sec.num_agents - 1, local_num_envs(cfg, world_size)
    rows = 32 * (sp.pool_size + 4) if _selfplay_rows(cfg) else 0  # self-play's game results, per message
    chunk = chunk_bytes(cfg, world_size) - rows
    chunk_keys = f"{section}.chunk_size, {section}.max_inflight"
    sizes = LayoutSizes(frame, fwd, params, n_envs, net_keys)
    learner = [(actors * sec.max_inflight * chunk, f"{actors} actor(s) x {sec.max_inflight:,} messages in flight x "
                f"{chunk:,} bytes", chunk_keys)]
    actor = [(8 * params, f"network {params:,} parameters x 2 (the copy it acts with, the weights received)",
              net_keys),
             (sec.max_inflight * chunk, f"{sec.max_inflight:,} messages in flight x {chunk:,} bytes", chunk_keys),
             (n_envs * fwd, f"{n_envs:,} envs' forward pass", "env.num_envs")]
    if rows:
        learner.append((actors * sec.max_inflight * rows, f"{actors} actor(s) x {sec.max_inflight:,} messages' "
                        f"game-result rows of {rows:,} bytes", "selfplay.pool_size"))
        actor.append((sec.max_inflight * rows, f"{sec.max_inflight:,} messages' game-result rows of {rows:,} bytes",
                      "selfplay.pool_size"))
    more_learner, more_actor = algorithm(cfg).memory(cfg, world_size, sizes)
    return learner + more_learner, actor + more_actor


def memory_available(ranks_on_node: int) -> int:
    """Bytes this rank may use: the node's available memory (and its cgroup's, under Slurm) shared
    by the ranks on the node."""
    import psutil
    avail = psutil.virtual_memory().available
    try:  # cgroup v2: Slurm's per-job limit
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit.isdigit():
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(avail, 0) // max(ranks_on_node, 1)


def host_problems(cfg: Config, world_size: int, ranks_on_node: int) -> list[str]:
    """What this node cannot give the config: memory for its sizes, cores for its threads."""
    errs = [memory_problem(cfg, world_size, ranks_on_node)]
    cores = os.cpu_count() or 1
    if cfg.parallel.threads_per_rank > cores:
        errs.append(f"parallel.threads_per_rank: {cfg.parallel.threads_per_rank} threads per rank on a node of {cores} "
                    f"core(s); allowed: 0 (auto) to {cores}")
    return [e for e in errs if e]


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f}"


def memory_problem(cfg: Config, world_size: int, ranks_on_node: int) -> str | None:
    if actor_learner(cfg):
        return _layout_memory_problem(cfg, world_size, ranks_on_node)
    need, parts = memory_floor(cfg, world_size)
    have = memory_available(ranks_on_node)
    if need <= have:
        return None
    return (f"memory: this config needs at least {need / 2**30:,.1f} GiB per rank ({parts}), but {have / 2**30:,.1f} GiB "
            f"are available to each of the {ranks_on_node} rank(s) on this node; lower model.hidden_size, model.channels, "
            f"env.num_envs or training.n_steps")


def _layout_memory_problem(cfg: Config, world_size: int, ranks_on_node: int) -> str | None:
    """The learners and actors this node holds against its available memory. Ranks are placed in
    order, agent after agent (a learner, then its actors), so a node of r ranks holds at most
    ceil(r / ranks per agent) learners (the first node holds that many)."""
    per_agent = world_size // layout_section(cfg).num_agents
    learners = min(layout_section(cfg).num_agents, -(-ranks_on_node // max(per_agent, 1)))
    actors = max(ranks_on_node - learners, 0)
    learner, actor = layout_memory(cfg, world_size)
    one_learner, one_actor = sum(b for b, _, _ in learner), sum(b for b, _, _ in actor)
    need = learners * one_learner + actors * one_actor
    have = memory_available(1)
    if need <= have:
        return None
    weighted = sorted([(learners * b, "learner", what, keys) for b, what, keys in learner] +
                      [(actors * b, "actor", what, keys) for b, what, keys in actor], key=lambda x: -x[0])
    top, covered = [], 0
    for part in weighted:  # the few parts that make most of it: what to lower
        if not part[0]:
            break
        top.append(part)
        covered += part[0]
        if covered >= 0.9 * need:
            break
    keys = list(dict.fromkeys(k.strip() for _, _, _, ks in top for k in ks.split(",")))
    most = "; ".join(f"{role}: {what} = {_gib(b / (learners if role == 'learner' else actors))} GiB"
                     for b, role, what, _ in top)
    return (f"memory: this config needs at least {_gib(need)} GiB on this node ({learners} learner(s) x "
            f"{_gib(one_learner)} GiB + {actors} actor(s) x {_gib(one_actor)} GiB; most of it: {most}), but "
            f"{_gib(have)} GiB are available there; lower {', '.join(keys)}")


def build(data: dict, overrides: list[tuple[str, str, Any]], world_size: int) -> Config:
    """Merge + type-check + validate; raises UsageError with every problem found."""
    errors: list[str] = []
    cfg = from_dict(merge_overrides(data, overrides), errors)
    if errors:
        raise UsageError(errors)
    errors = validate(cfg, world_size)
    if errors:
        raise UsageError(errors)
    return cfg


def _yaml_value(v) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def describe(markdown: bool = False) -> str:
    """Every key with its default and help: YAML-like text, or a Markdown table (docs/config.md)."""
    lines = ["| key | default | meaning |", "|---|---|---|"] if markdown else []
    for sec_name, cls in _section_classes().items():
        if not markdown:
            lines.append(f"{sec_name}:")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if markdown:
                text = f.metadata["help"].replace("|", "\\|")
                lines.append(f"| `{sec_name}.{file_key(sec_name, f.name)}` | `{_yaml_value(default)}` | {text} |")
            else:
                lines.append(f"  {file_key(sec_name, f.name) + ':':<22} {_yaml_value(default):<14} # {f.metadata['help']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    print(describe(markdown="--markdown" in sys.argv))
