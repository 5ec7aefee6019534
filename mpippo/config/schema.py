"""The config's schema: its typed sections (one dataclass each, every key with its default and help),
the algorithms' sections added from the registry, and reading a mapping into a `Config` with every
type checked (`from_dict`); `describe` lists the keys (`python -m mpippo.config`)."""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from mpippo import envs
from mpippo.algos import registry
from mpippo.rules import show
from mpippo.usage import UsageError

ALGOS = registry.NAMES  # training.algo: one registry entry each (mpippo/algos/registry.py)
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ppo_procgen.yaml"

INT64_MAX = 2**63 - 1
MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; anything near this is not one


_f = registry.setting  # a key: its default and help
FILE_KEYS = {("env", "imports"): "import"}  # fields whose key in a config file is a Python keyword


def file_key(section: str, name: str) -> str:
    """A field's key as config files, --set and messages spell it."""
    return FILE_KEYS.get((section, name), name)


@dataclass
class EnvConfig:
    name: str = _f(envs.DEFAULT_ENV, "The env, by family (mpippo/envs/): a Procgen game (`coinrun` or `procgen-coinrun-v0`); the built-in test env `toy-cue`; `connect4` (two-player: against the random player, or a self-play pool with selfplay.enabled; actions masked to legal columns in DQN); `gym:<id>`, any Gymnasium id (`gym:CartPole-v1`), the user's own with env.import; `pz:<game>`, a two-player game of PettingZoo's AEC API (two-player, as connect4): `pz:connect_four_v3`, `pz:tictactoe_v3`, or the user's own, `pz:<name>` with env.import module:callable; `atari:<Game>`, an ALE game (`atari:Breakout`) with the standard preprocessing.")
    kwargs: dict = _f({}, "gym:<id>: keyword arguments of gymnasium.make (e.g. {max_episode_steps: 200}); pz:<name> of env.import: keyword arguments of its callable; atari:<Game>: repeat_action_probability (0.0), full_action_space (false), noop_max (30), max_episode_steps (27000), episodic_life (true), reward_clip (true).")
    imports: Optional[str] = _f(None, "The user's env (the key is `import`). gym:<id>: the module to import first, which registers the id (`mypackage.envs`), or `module:callable` returning a gymnasium.Env, registered as env.name's id; pz:<name>: `module:callable` returning a two-player PettingZoo AEC env. Runs the user's code: only ever imported when a config or command line names it.")
    distribution_mode: str = _f("easy", "Procgen difficulty: easy | hard | extreme | memory | exploration (procgen's own default is hard; extreme, memory and exploration exist for some games only, exploration plays one fixed level).")
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
    collective_timeout_s: float = _f(600.0, "Abort the job when one collective waits longer than this (watchdog; start-up's at least 300 s), "
                                     "a one-rank job (and an evaluate rank) when one step lasts this long; 0 = off.")
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
    total_timesteps: int = _f(25_000_000, "Env steps over all ranks; the run ends when reached (or at duration_hours). The sync layout trains whole updates (envs x n_steps): a budget between two ends at the next, said at start.")
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
    precision: str = _f("auto", "auto | fp32 | bf16. bf16 runs the network's forward and backward under autocast; parameters, optimizer and losses stay fp32. auto: bf16 where the hardware computes it natively (CPU flag avx512_bf16 or amx_bf16, GPU compute capability >= 8.0; for sync PPO on every rank), else fp32; fp32 for vector observations (their MLPs are too small for bf16 to pay). The start-up line and benchmark_metrics.json say which ran and why (config.yaml keeps auto, for a resume elsewhere to settle again).")
    cuda_graph: bool = _f(True, "On a GPU: the rollout's policy step (forward, action, log-prob, value) is captured once as a CUDA graph and replayed: one launch per env step instead of about 80 kernels dispatched from Python; the same actions as eager (the noise is drawn outside the graph). false, the CPU, or a capture that fails or whose replay differs from the eager step (one warning): eager. The start-up line and benchmark_metrics.json (policy_step) say which ran.")

    def norm_gamma(self) -> float:
        """The discount of the returns that the reward normalizer tracks."""
        return self.gamma if self.reward_norm_gamma is None else self.reward_norm_gamma


@dataclass
class SelfPlayConfig:
    enabled: bool = _f(False, "Self-play (DQN on a two-player game): actors play frozen snapshots of the learner from an opponent pool instead of the random player.")
    snapshot_interval_updates: int = _f(200, "Learner updates between snapshots added to the pool (the starting network is member 0).")
    pool_size: int = _f(8, "Most members kept in the pool (and cached on each actor); beyond it one is dropped, never the newest.")
    sampling: str = _f("uniform", "Opponent per actor game: latest | uniform | prioritized (by the learner's recent loss rate against each member).")
    drop: str = _f("oldest", "Member dropped when the pool is full: oldest | lowest_rated.")
    priority_exponent: float = _f(1.0, "prioritized: p ~ loss_rate ** this (larger = focus on the members the learner loses to).")
    opponent_eps: float = _f(0.05, "Pool members play a random legal move at this rate (else greedy), so no game is one fixed line.")
    heuristic_prob: float = _f(0.1, "Share of actor games against the game's fixed players (random, and one-step lookahead on Connect Four: half each).")
    elo_k: float = _f(16.0, "Elo K-factor of the ratings (learner, members, heuristics; random is the anchor at 0).")
    eval_interval_updates: int = _f(250, "Learner updates between greedy rating games against the heuristic players (the win-rate curve); 0 = only at start and end.")
    eval_games: int = _f(100, "Greedy games against each heuristic player per rating round (the learner opens half of them).")


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


def mapping_keys() -> set[tuple[str, str]]:
    """(section, key) of the keys whose value is a mapping (env.kwargs): `--set env.kwargs.name=value`
    sets one entry of it, the rest kept."""
    return {(sec, file_key(sec, name)) for sec, cls in _section_classes().items()
            for name, tp in typing.get_type_hints(cls).items() if tp is dict}


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
        try:  # a config.yaml mpippo wrote is read as YAML 1.1, where 3e-4 (no dot) is a string; users mean a float
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
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every `<` check below; refuse it here
        raise UsageError(f"{where}: must be a finite number, got {value}")  # (an int too large for a float: below)
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
    want = show(saved)[1:-1] if isinstance(saved, str) else saved
    if named and named[-1] != saved:  # (another module: the run's own is the one its checkpoint was trained with)
        raise UsageError(f"--resume: --set env.import={show(named[-1])[1:-1] if isinstance(named[-1], str) else named[-1]}"
                         f" is not the run's env.import {show(saved)}; allowed: --set env.import={want}")
    if not named:
        raise UsageError(f"--resume: the run's config.yaml has env.import {show(saved)}, the user's code, which is "
                         f"imported only when named: add --set env.import={want}")


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



INITS = ("glorot", "torch", "orthogonal")
ARCHS = ("impala", "nature")


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


