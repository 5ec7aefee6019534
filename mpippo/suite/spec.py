"""A suite file: games x seeds x variants of one base config, each member its own run folder.

    name: procgen_easy_16
    base_config: configs/ppo_procgen.yaml
    games: [bigfish, bossfight, ...]   # any env.name: Procgen games, gym:<id>, ...
    seeds: [1, 2, 3]
    budget: 25000000          # env steps per member
    ranks: 8                  # MPI ranks per member (one array element)
    cpus_per_rank: 1
    gpus_per_rank: 0
    time: "24:00:00"          # Slurm time limit per element; it requeues itself and resumes beyond it
    distribution_mode: easy
    variants:                 # name -> --set overrides (an empty list: the base config as it is)
      default: []
      bf16: [training.precision=bf16]

Member i's folder: <root>/suites/<name>/<variant>/<game>/seed_<s>, its console log beside it
(seed_<s>.log); a game's folder name keeps letters, digits, '_', '.', '-' (gym:Hopper-v5 -> gym_Hopper-v5).
`distribution_mode` is passed to the games whose family reads it (Procgen). Everything is checked when the file is read, the variants' overrides against
the config schema too, so a bad suite is one line before anything is submitted.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from mpippo import config as C
from mpippo import envs, files
KEYS = {"name": str, "base_config": str, "games": list, "seeds": list, "budget": int, "ranks": int,
        "cpus_per_rank": int, "gpus_per_rank": int, "time": str, "distribution_mode": str, "variants": dict}
DEFAULTS = {"cpus_per_rank": 1, "gpus_per_rank": 0, "time": "24:00:00", "distribution_mode": "easy",
            "variants": {"default": []}}
SUITE_OWNED = {("env", "name"), ("env", "distribution_mode"), ("training", "total_timesteps"), ("training", "seed")}
MAX_MEMBERS = 1000  # array indices 0..999: within Slurm's default MaxArraySize (1001)
LIMITS = {"ranks": 100_000, "cpus_per_rank": 4096, "gpus_per_rank": 64}
TIME = re.compile(r"(\d{1,3}-)?\d{1,4}(:\d{2}){0,2}")
ROOT = Path(__file__).resolve().parents[2]  # the repository: where the members run, and configs/suites/
SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: no trailing newline slips through


class SuiteError(C.UsageError):
    """Bad suite input: one line, exit 2."""


@dataclass(frozen=True)
class Member:
    index: int
    variant: str
    game: str
    seed: int
    folder: Path
    args: tuple[str, ...]  # the trainer's options for a fresh start

    @property
    def key(self) -> str:
        return f"{self.variant}/{self.game}/seed_{self.seed}"

    @property
    def log(self) -> Path:
        return log_path(self.folder)


def log_path(folder: Path) -> Path:
    """A member's console log, beside its folder (slurm/suite_member.sh appends to the same name)."""
    return folder.with_name(folder.name + ".log")


@dataclass(frozen=True)
class Suite:
    path: Path
    name: str
    base_config: str
    games: tuple[str, ...]
    seeds: tuple[int, ...]
    budget: int
    ranks: int
    cpus_per_rank: int
    gpus_per_rank: int
    time: str
    distribution_mode: str
    variants: dict
    root: Path
    algos: dict = field(default_factory=dict, compare=False)  # variant -> training.algo it resolves to

    @property
    def folder(self) -> Path:
        return self.root / "suites" / self.name

    @property
    def config_file(self) -> Path:
        """base_config as the members read it: they run from the repository root (Slurm's batch script
        and --local alike), whichever folder the suite was started from."""
        return ROOT / self.base_config

    def members(self) -> list[Member]:
        """Variant-major, then game, then seed: the same file always gives the same order."""
        out = []
        for variant, overrides in self.variants.items():
            for game in self.games:
                for seed in self.seeds:
                    folder = self.folder / variant / game_folder(game) / f"seed_{seed}"
                    mode = ("--set", f"env.distribution_mode={self.distribution_mode}") if reads_mode(game) else ()
                    args = ("--config", self.base_config, "--set", f"env.name={game}", *mode, "--seed", str(seed),
                            "--total-timesteps", str(self.budget), *[a for o in overrides for a in ("--set", o)])
                    out.append(Member(len(out), variant, game, seed, folder, args))
        return out


def game_folder(game: str) -> str:
    """A game's folder name: env names such as gym:mypackage/Env-v0 hold ':' and '/'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", game)


def reads_mode(game: str) -> bool:
    """Whether the game's env family takes env.distribution_mode (Procgen's); not a game of any family: no."""
    fam = envs.family_of(game)
    return fam is not None and "distribution_mode" in fam.keys


def load(path: str | Path, root: str | Path = "runs") -> Suite:
    """The suite at `path` (a file, or a name under configs/suites/), checked; SuiteError if bad."""
    path = _find(Path(path))
    if Path(root).exists() and not Path(root).is_dir():
        raise SuiteError(f"--root: '{root}' is not a folder (suites go to <root>/suites/<name>/)")
    try:
        data = C.load_yaml(path)
    except C.UsageError as e:
        raise SuiteError(f"suite {e.errors[0]}") from None
    unknown = sorted(set(data) - set(KEYS), key=str)
    if unknown:
        raise SuiteError(f"suite '{path}': unknown key '{unknown[0]}' (allowed: {', '.join(KEYS)})")
    data = {**DEFAULTS, **data}
    for key, kind in KEYS.items():
        if key not in data:
            raise SuiteError(f"suite '{path}': '{key}' is missing")
        if not isinstance(data[key], kind) or isinstance(data[key], bool):
            raise SuiteError(f"suite '{path}': {key}: expected {kind.__name__}, got {C.show(data[key])}")
    games = tuple(envs.canonical_env_name(g) if isinstance(g, str) else g for g in data["games"])  # as runs name them
    suite = Suite(path, data["name"], data["base_config"], games, tuple(data["seeds"]), data["budget"],
                  data["ranks"], data["cpus_per_rank"], data["gpus_per_rank"], data["time"],
                  data["distribution_mode"], dict(data["variants"]), Path(root).resolve())
    _check(suite)
    for folder in (suite.root / "suites", suite.folder):
        if folder.exists() and not folder.is_dir():
            raise SuiteError(f"suite {suite.name}: '{folder}' is not a folder (the suite's members go under it); "
                             f"move it away or choose another --root")
    return suite


def _find(path: Path) -> Path:
    if path.is_file():
        return path
    for candidate in (ROOT / "configs/suites" / f"{path}.yaml", ROOT / "configs/suites" / path):
        if candidate.is_file():
            return candidate.relative_to(ROOT) if Path.cwd() == ROOT else candidate  # (as its lines name it)
    raise SuiteError(f"suite '{path}': no such file (nor configs/suites/{path}.yaml in the repository)")


def _check(s: Suite) -> None:
    """Every value in range, and every variant a valid config: the first problem, one line."""
    where = f"suite '{s.path}'"
    if not SLUG.fullmatch(s.name):
        raise SuiteError(f"{where}: name: {C.show(s.name)} must be letters, digits, '_', '.', '-' (a folder name)")
    for g in s.games:
        if not isinstance(g, str) or envs.family_of(g) is None:
            raise SuiteError(f"{where}: games: {C.show(g)} is not an env name (allowed: {envs.allowed_env_names()})")
    if not s.games or len({game_folder(g) for g in s.games}) != len(s.games):
        raise SuiteError(f"{where}: games: give each game once, at least one (and no two that differ only in "
                         f"characters a folder name cannot hold)")
    # below 2^31 - 1: the per-rank seeds are taken modulo that prime, where 2^31 - 1 would run as seed 0
    if not s.seeds or not all(type(x) is int and 0 <= x < 2**31 - 1 for x in s.seeds) or len(set(s.seeds)) != len(s.seeds):
        raise SuiteError(f"{where}: seeds: distinct integers in [0, 2^31 - 1), at least one; got {C.show(list(s.seeds))}")
    members = len(s.games) * len(s.seeds) * max(len(s.variants), 1)
    if members > MAX_MEMBERS:
        raise SuiteError(f"{where}: {members} members (games x seeds x variants) is more than {MAX_MEMBERS}, "
                         f"the largest job array Slurm accepts by default (MaxArraySize); split the suite")
    for key, low in (("budget", 1), ("ranks", 1), ("cpus_per_rank", 1), ("gpus_per_rank", 0)):
        if getattr(s, key) < low:
            raise SuiteError(f"{where}: {key}: must be >= {low}, got {getattr(s, key)}")
    for key, high in LIMITS.items():
        if getattr(s, key) > high:
            raise SuiteError(f"{where}: {key}: at most {high:,} (more than any cluster gives one job), "
                             f"got {C.show(getattr(s, key))}")
    if not TIME.fullmatch(s.time) or any(int(x) >= 60 for x in s.time.split(":")[1:]) \
            or ("-" in s.time and int(s.time.split("-")[1].split(":")[0]) >= 24):
        raise SuiteError(f"{where}: time: {C.show(s.time)} is not a Slurm time limit (minutes, minutes:seconds, "
                         f"hours:minutes:seconds or days-hours[:minutes[:seconds]], e.g. 24:00:00 or 1-00:00:00)")
    if s.distribution_mode not in ("easy", "hard"):
        raise SuiteError(f"{where}: distribution_mode: {C.show(s.distribution_mode)} is not one of easy, hard")
    if _breaks_line(s.base_config):  # (the batch script reads a member's options one a line)
        raise SuiteError(f"{where}: base_config: {C.show(s.base_config)} holds a line break or a NUL")
    if not s.config_file.is_file():
        raise SuiteError(f"{where}: base_config: {C.show(s.base_config)} is not a file (a relative path is from the "
                         f"repository root, {C.show(str(ROOT))}, where the members run)")
    if not s.variants:
        raise SuiteError(f"{where}: variants: at least one (default: [] runs the base config as it is)")
    for i, (name, overrides) in enumerate(s.variants.items()):
        if not isinstance(name, str) or not SLUG.fullmatch(name):
            raise SuiteError(f"{where}: variants: name {C.show(name)} must be letters, digits, '_', '.', '-'")
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise SuiteError(f"{where}: variants.{name}: a list of 'section.key=value' strings, got {C.show(overrides)}")
        if (broken := next((o for o in overrides if _breaks_line(o)), None)) is not None:
            raise SuiteError(f"{where}: variants.{name}: {C.show(broken)} holds a line break or a NUL; the batch "
                             f"script reads a member's options one a line (slurm/suite_member.sh)")
        # every game with the first variant (a misspelled gym: or atari: game is refused before anything is
        # submitted, not by its member's run); the other variants with each family's first game
        _check_variant(s, name, overrides, every_game=i == 0)


def _check_variant(s: Suite, name: str, overrides: list[str], every_game: bool = True) -> None:
    """The member configs of this variant, built as the trainer will build them (schema, ranges, the
    env's name and settings): for every game, or for each env family's first game."""
    try:
        sets = [C.parse_override(o) for o in overrides]
        for section, key, _ in sets:
            if (section, key) in SUITE_OWNED:
                raise SuiteError(f"suite '{s.path}': variants.{name}: {section}.{key} is the suite's to set "
                                 f"(games, distribution_mode, budget, seeds), not a variant's")
        firsts = {envs.family_of(g).name: g for g in reversed(s.games)}  # each family's first game
        for game in s.games if every_game else firsts.values():
            mode = [("env", "distribution_mode", s.distribution_mode)] if reads_mode(game) else []
            cfg = C.build(C.load_yaml(s.config_file), sets + [("env", "name", game), *mode,
                                                              ("training", "total_timesteps", s.budget)], s.ranks)
    except SuiteError:
        raise
    except C.UsageError as e:
        raise SuiteError(f"suite '{s.path}': variants.{name}: {e.errors[0]}") from None
    if C.actor_learner(cfg) and C.layout_section(cfg).num_agents != 1:
        raise SuiteError(f"suite '{s.path}': variants.{name}: {cfg.training.algo}.num_agents: a suite member is one "
                         f"agent (one run folder), got {C.layout_section(cfg).num_agents}")
    s.algos[name] = cfg.training.algo


def write_manifest(path: Path, members: list[Member]) -> None:
    """The members an array was submitted for, by array index (the member's index): the array
    element reads its own line, so a later edit of the suite file cannot shift a pending element."""
    rows = {m.index: {"key": m.key, "folder": str(m.folder), "args": list(m.args)} for m in members}
    files.atomic_write_bytes(path, json.dumps(rows, indent=1).encode())


def _breaks_line(text: str) -> bool:
    """A line break (suite_member.sh reads one value a line), or a NUL (no path or option holds one)."""
    return "\n" in text or "\r" in text or "\0" in text


def read_manifest(path: str | Path) -> dict[str, dict]:
    """A submission's manifest, {array index: {key, folder, args}}, checked: a damaged or foreign
    file is one line naming it (a UsageError), never a member run from what it happens to hold."""
    rows = files.read_json(path, "suite manifest")
    for index, row in rows.items():
        where = f"suite manifest '{C.show(str(path))[1:-1]}': entry {C.show(index)}"
        if not (index.isascii() and index.isdigit()) or len(index) > 4:  # ("²" is a digit to isdigit())
            raise SuiteError(f"{where}: expected an array index (0-{MAX_MEMBERS - 1}) as its key")
        if not isinstance(row, dict) or not isinstance(row.get("key"), str) or not isinstance(row.get("folder"), str) \
                or not row["folder"] or not isinstance(row.get("args"), list) \
                or not all(isinstance(a, str) for a in row["args"]):
            raise SuiteError(f"{where}: expected {{\"key\": text, \"folder\": text, \"args\": [text, ...]}}, "
                             f"got {C.show(row)}; it is not a manifest `suite run` wrote")
        if any(_breaks_line(x) for x in (row["folder"], *row["args"])):  # (suite_member.sh reads one a line)
            raise SuiteError(f"{where}: its folder or an option holds a line break or a NUL; it is not a manifest "
                             f"`suite run` wrote")
    return rows


def manifest_entry(path: Path, index: int) -> dict:
    rows = read_manifest(path)
    if str(index) not in rows:
        raise SuiteError(f"suite manifest '{C.show(str(path))[1:-1]}': no member with array index {index} "
                         f"(it lists {C.show(sorted(rows, key=int))})")
    return rows[str(index)]
