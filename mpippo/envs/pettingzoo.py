"""`pz:<game>`: two-player turn-based games of PettingZoo's AEC API, played as the built-in
Connect Four is (envs/connect4.py): to the learner an ordinary single-player batch env whose
opponent moves inside `act`, so self-play's pool (mpippo/selfplay.py), DQN's action masks and the
rating games work unchanged.

The games: PettingZoo's classic ones that need nothing beyond PettingZoo (`pz:connect_four_v3`,
`pz:tictactoe_v3`), or the user's own, `pz:<name>` with `env.import: module:callable`, the callable
returning an AEC env (PettingZoo has no registry of ids: the name is the user's label, which
config.yaml, checkpoints and evaluate keep). A game qualifies when it has two agents with the same
spaces: Discrete(A) actions, and Dict observations of an `observation` Box and an `action_mask`
Box (A,) (PettingZoo's classic convention). Observations of shape (H, W, C) are planes for the CNNs
(0/1 planes stored as uint8 0/255, like the built-in game; uint8 as they are), of shape (D,) vectors
for the MLP (float32).

Each of N AEC envs holds one game; the learner takes one seat, alternating which seat moves first
game after game; the opponent is any policy (obs, mask) -> actions, or a per-env one (`per_env`,
told `games_started` and `games_ended`) such as the pool's cache. The opponent moves while it is
its turn, so a game may give one player several moves in a row. The learner's reward for a move is
its own rewards from that move until its next turn (AEC's `rewards` after each step); a game's
outcome is the sign of its total (+1 win, -1 loss, 0 draw in the classic games). A truncated game
ends as a terminated one does (a board game has no time limit to bootstrap past). The learner's
illegal move ends the game as its loss, -1, without reaching the game (PettingZoo's own rule for its
classic games; PPO and A2C do not mask); the opponents pick legal moves. A game's state cannot be
saved: a resume starts fresh games.
"""
from __future__ import annotations

import difflib
import importlib
import math
import os
import re
import sys

import numpy as np

from mpippo.envs import connect4
from mpippo.envs.family import EnvFamily, Spaces, a_flag, a_number, looks_channels_first, too_large
from mpippo.envs.gym import MODULE, BadReturn, _float32_default, _what, _where, _why, kwargs_problem
from mpippo.errors import EnvFailure, users_code, who
from mpippo.usage import UsageError, reason, show

PREFIX = "pz:"
# PettingZoo's classic two-player games that install with PettingZoo alone (chess, go's own
# dependencies and the card games' rlcard are not ours to pull in): name -> module
GAMES = {"connect_four_v3": "pettingzoo.classic.connect_four_v3", "tictactoe_v3": "pettingzoo.classic.tictactoe_v3"}
CONNECT_FOUR = "connect_four_v3"  # Connect Four's rules: the lookahead player and mirrored training apply
MAX_GAME_MOVES = 10_000  # both players' moves in one game, before it is taken for one that never ends
MAX_RESTARTS = 100  # rounds of new games ending in their opening moves, before the game is taken for one that ends as it starts
KINDS = {"planes": "0/1 planes", "uint8": "uint8 planes", "vector": "a vector"}  # observations, by how they convert
PLANE_RANGE = {"planes": (0, 1), "uint8": (0, 255)}  # the values planes may hold (a vector's: any finite)
LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_MAKERS: dict[tuple, object] = {}  # (game, env.import) -> its constructor (a classic module's env, or the user's callable)


def game_of(name: str) -> str:
    return name[len(PREFIX):]


def _quiet() -> None:
    """PettingZoo prints a warning per illegal move (an illegal move is part of learning here)."""
    from pettingzoo.utils.env_logger import EnvLogger
    EnvLogger.suppress_output()


LEARNER, OPPONENT, OVER = 0, 1, 2  # whose move a game waits for (PettingZooVecEnv._read_turn)


def _holder(game):
    """Where a game's turn, ends and rewards are read: past PettingZoo's own wrappers, which forward
    every read through three `__getattr__`s (40% of a Connect Four vector step) and keep no state of
    their own (TerminateIllegalWrapper writes the env's); a user's own wrapper is read as it is."""
    try:
        from pettingzoo.utils.wrappers import BaseWrapper
    except ImportError:  # (a game of one's own that does not use PettingZoo's classes)
        return game
    while isinstance(game, BaseWrapper) and type(game).__module__.startswith("pettingzoo."):
        game = game.env
    return game


def _random(rng: np.random.Generator):
    """The default opponent: a uniformly random legal move."""
    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.array([rng.choice(np.flatnonzero(m)) for m in mask], dtype=np.int64)
    return act


def _classic(game: str):
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # (pygame, its renderer, greets on stdout when imported)
    return importlib.import_module(GAMES[game]).env


def _user(spec: str):
    """env.import's module:callable, imported (the user's code runs): the game's constructor."""
    module, _, attr = spec.partition(":")
    try:
        with users_code():
            mod = importlib.import_module(module)
        _float32_default()  # (torch's default dtype put back and said, as for a Gymnasium env's module)
    except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's code may raise anything on import, or exit)
        raise UsageError(f"env.import: importing '{module}' failed ({_why(e, 160)})") from None
    make = getattr(mod, attr, None)
    if not callable(make):
        raise UsageError(f"env.import: '{module}' has no callable '{attr}' (module:callable names a function or class "
                         f"that returns a PettingZoo AEC env)")
    return make


def maker(cfg):
    """The constructor of the config's game (imported on first use; the family's check ran first)."""
    game, spec = game_of(cfg.env.name), cfg.env.imports
    if (game, spec) not in _MAKERS:
        _MAKERS[game, spec] = _classic(game) if spec is None else _user(spec)
        _quiet()
    return _MAKERS[game, spec]


def _spaces_of(game, name: str) -> tuple[Spaces, str]:
    """(the batch interface's spaces, how observations convert: planes | uint8 | vector) of a made game,
    or one line naming what does not qualify."""
    from gymnasium import spaces as gs
    agents = list(getattr(game, "possible_agents", None) or [])
    if len(agents) != 2 or agents[0] == agents[1]:
        raise UsageError(f"env.name: '{name}' has {len(agents)} agent(s) ({', '.join(map(str, agents[:4]))}); allowed: "
                         f"two-player games (possible_agents of two, named apart)")
    acts, obs = [game.action_space(a) for a in agents], [game.observation_space(a) for a in agents]
    if not all(isinstance(a, gs.Discrete) and a.start == 0 for a in acts) or acts[0].n != acts[1].n:
        raise UsageError(f"env.name: '{name}': its action spaces {', '.join(str(a)[:60] for a in acts)} are not one "
                         f"Discrete(A) for both agents; allowed: Discrete(A), the same for both")
    n = int(acts[0].n)
    ok = all(isinstance(o, gs.Dict) and isinstance(o.get("observation"), gs.Box)
             and isinstance(o.get("action_mask"), gs.Box) and o["action_mask"].shape == (n,) for o in obs)
    if not ok or obs[0]["observation"].shape != obs[1]["observation"].shape:
        raise UsageError(f"env.name: '{name}': its observation space {str(obs[0])[:120]} is not a Dict of an "
                         f"'observation' Box and an 'action_mask' Box ({n},), the same for both agents; allowed: "
                         f"PettingZoo's classic convention (observe() returns both)")
    box = obs[0]["observation"]
    shape, kind = tuple(int(d) for d in box.shape), None
    whole = box.dtype == np.bool_ or np.issubdtype(box.dtype, np.integer)
    if len(shape) == 1 and shape[0] > 0:
        kind = "vector"
    elif len(shape) == 3 and 0 not in shape and whole and box.low.min() >= 0:
        kind = "planes" if box.high.max() <= 1 else "uint8" if box.dtype == np.uint8 else None  # (0/1 ones: x 255)
    if kind is None:
        raise UsageError(f"env.name: '{name}': its observations {str(box)[:120]} are not supported; allowed: planes "
                         f"(H, W, C) of integers or bools in [0, 1], or uint8 (the CNNs), or a vector (D,) (the MLP)")
    if (large := too_large(shape, n)):
        raise UsageError(f"env.name: '{name}' has {large}: more than a network here is built for")
    if kind != "vector" and looks_channels_first(shape):
        raise UsageError(f"env.name: '{name}': its observations {str(box)[:120]} look channels-first (C, H, W); "
                         f"allowed: planes (H, W, C), as PettingZoo's classic games' (np.transpose(obs, (1, 2, 0)))")
    return Spaces(shape, "float32" if kind == "vector" else "uint8", n), kind


class PettingZooVecEnv:
    def __init__(self, cfg, num_envs: int, seed: int, spaces: Spaces, kind: str, opponent=None,
                 alternate_seats: bool = False):
        self.name, self.num_envs, self.kind = cfg.env.name, num_envs, kind
        self.checked = cfg.env.imports is not None  # a user's game: its observations' values checked at every view
        self.obs_shape, self.num_actions = spaces.obs_shape, spaces.num_actions
        self.steps = 0  # moves made in this rank's games (messages name it)
        self.games: list = []
        try:  # at start-up: a game that fails here is refused as one that cannot be made at all
            self._begin(cfg, seed, opponent, spaces.obs_dtype, alternate_seats)
        except EnvFailure as e:
            self.close()
            raise UsageError(f"env.name: '{self.name}': making {num_envs} and starting their games failed "
                             f"({str(e).removeprefix(f'env.name: {self.name!r} ')})") from None

    def _begin(self, cfg, seed: int, opponent, obs_dtype: str, alternate_seats: bool) -> None:
        num_envs, make = self.num_envs, maker(cfg)
        for _ in range(num_envs):
            self.games.append(self._call("constructor", lambda: make(**cfg.env.kwargs)))
        _float32_default()
        self.state = [_holder(g) for g in self.games]  # where each game's turn, ends and rewards are read
        self.rng = np.random.default_rng(seed)  # the seats, each game's seed, the default opponent
        self.opponent = opponent or _random(self.rng)
        # (each new game flips an env's seat; rating games open half of them: odd envs start flipped)
        self.agent_first = np.arange(num_envs) % 2 == 1 if alternate_seats else self.rng.random(num_envs) < 0.5
        self.me = [""] * num_envs
        self.rew = np.zeros(num_envs, dtype=np.float32)
        self.total = np.zeros(num_envs, dtype=np.float32)  # the learner's rewards in each game so far
        self.outcomes = np.zeros(num_envs, dtype=np.float32)  # each game's total, as the last act ended it
        # (env, the learner's total, its moves) of each game ended since episodes() last took them, in order: the
        # games the opponent's opening moves ended too, which the learner's reward stream never shows
        self.results: list[tuple[int, float, int]] = []
        self.first = np.ones(num_envs, dtype=bool)
        self.moves = np.zeros(num_envs, dtype=np.int64)  # moves in each env's game so far
        self.turns = np.zeros(num_envs, dtype=np.int64)  # the learner's moves in each env's game so far
        self.waiting = np.full(num_envs, OVER, dtype=np.int8)  # whose move each game waits for: read after each step,
        # OVER too where the learner's illegal move ended the game without a step
        self.illegal_moves = 0
        self.obs = np.zeros((num_envs, *self.obs_shape), dtype=obs_dtype)  # the learner's view, after each act
        self.mask = np.ones((num_envs, self.num_actions), dtype=bool)
        self._start(np.arange(num_envs))
        self._settle()
        self._refresh()

    def _call(self, during: str, fn, *args):
        """The game's code (the user's, for a game of env.import): whatever it raises is one line."""
        try:
            with users_code():
                return fn(*args)
        except BadReturn as e:
            raise EnvFailure(f"env.name: '{self.name}' returned {e} at move {self.steps:,} of this rank; allowed: "
                             f"{e.allowed}") from None
        except (Exception, SystemExit, GeneratorExit) as e:  # noqa: BLE001 (not KeyboardInterrupt: a person's Ctrl-C)
            raise EnvFailure(f"env.name: '{self.name}' {_what(e)} in its {during} (move {self.steps:,} of this rank)"
                             f"{_where(e)}; allowed: a PettingZoo AEC env of two players") from None

    def set_opponent(self, opponent) -> None:
        """Play `opponent` from now on; the games in progress are abandoned (uncounted) and start anew."""
        self.opponent = opponent
        self.rew[:] = 0.0
        self.first[:] = True
        self.results = []  # (games the last opponent's opening moves ended: not this one's)
        self._start(np.arange(self.num_envs))
        self._settle()
        self._refresh()

    def _refresh(self) -> None:
        """Every game's view for the learner (its turn in all of them), read once per act."""
        for i in range(self.num_envs):
            self.obs[i], self.mask[i] = self._view(i)

    def _view(self, i: int):
        """The mover's observation (converted) and legal moves in game i, checked against the spaces."""
        game, held = self.games[i], self.state[i]
        seen = self._call("observe()", lambda: game.observe(held.agent_selection))
        try:
            obs, mask = np.asarray(seen["observation"]), np.asarray(seen["action_mask"]).astype(bool)
        except (TypeError, KeyError, IndexError, ValueError) as e:
            raise EnvFailure(f"env.name: '{self.name}' returned {type(seen).__name__} from observe() ({reason(e, 80)}); "
                             f"allowed: a dict of 'observation' and 'action_mask'") from None
        if obs.shape != self.obs_shape or mask.shape != (self.num_actions,):
            raise EnvFailure(f"env.name: '{self.name}' returned an observation of shape {obs.shape} and a mask of "
                             f"{mask.shape} at move {self.steps:,} of this rank; allowed: {self.obs_shape} and "
                             f"({self.num_actions},), as its spaces declare")
        if not mask.any():  # (a policy would have to make an illegal move, which loses)
            raise EnvFailure(f"env.name: '{self.name}' returned an action_mask with no legal move for a player whose "
                             f"turn it is, at move {self.steps:,} of this rank; allowed: a legal move while the game "
                             f"goes on")
        obs = obs if obs.dtype.kind in "biuf" else self._numbers(obs)
        if self.checked:
            self._check_values(obs)
        return obs.astype(np.float32 if self.kind == "vector" else np.uint8) * (255 if self.kind == "planes" else 1), mask

    def _check_values(self, obs: np.ndarray) -> None:
        low, high = PLANE_RANGE.get(self.kind, (None, None))
        inside = np.isfinite(obs) if low is None else (obs >= low) & (obs <= high)
        if not inside.all():
            allowed = "finite values" if low is None else f"values in [{low}, {high}]"
            raise EnvFailure(f"env.name: '{self.name}' returned an observation holding {obs[~inside].flat[0]} at move "
                             f"{self.steps:,} of this rank; allowed: {allowed} ({KINDS[self.kind]})")

    def _numbers(self, obs: np.ndarray) -> np.ndarray:
        """The observation as numbers (a user's game may return text or objects of the right shape)."""
        try:
            return obs.astype(np.float64)
        except (TypeError, ValueError) as e:
            raise EnvFailure(f"env.name: '{self.name}' returned an observation of {obs.dtype} values ({reason(e, 80)}) "
                             f"at move {self.steps:,} of this rank; allowed: numbers ({KINDS[self.kind]})") from None

    def _start(self, idx: np.ndarray) -> None:
        """New games in envs idx; the opponent moves first where it is its turn to start."""
        if len(idx) == 0:
            return
        for i in idx:
            game = self.games[i]
            self._call("reset()", lambda: game.reset(seed=int(self.rng.integers(2**31 - 1))))
            self.agent_first[i] = not self.agent_first[i]
            self.me[i] = self._call("possible_agents", lambda: game.possible_agents[0 if self.agent_first[i] else 1])
            self.total[i], self.moves[i], self.turns[i] = 0.0, 0, 0
            self.waiting[i] = self._call("terminations", lambda: self._read_turn(i))
        if getattr(self.opponent, "per_env", False):
            self.opponent.games_started(np.asarray(idx))
        self._advance(np.asarray(idx), np.zeros(self.num_envs, dtype=np.float32))

    def _advance(self, idx: np.ndarray, gain: np.ndarray) -> None:
        """The opponent's moves in envs idx until it is the learner's turn or the game ended, one
        batched call of the opponent per round (bounded: _step ends a game of MAX_GAME_MOVES)."""
        while True:
            idx = idx[self.waiting[idx] == OPPONENT]
            if len(idx) == 0:
                return
            views = [self._view(i) for i in idx]
            obs, mask = np.stack([v[0] for v in views]), np.stack([v[1] for v in views])
            moves = self.opponent(obs, mask, idx) if getattr(self.opponent, "per_env", False) else self.opponent(obs, mask)
            for i, a in zip(idx, np.asarray(moves, dtype=np.int64)):
                self._step(i, a, gain)

    def _step(self, i: int, action: int, gain: np.ndarray) -> None:
        """One move in game i; the learner's reward from it is added to the game's total and `gain`."""
        game, held, me = self.games[i], self.state[i], self.me[i]
        self.steps += 1
        self.moves[i] += 1
        if self.moves[i] > MAX_GAME_MOVES:
            raise EnvFailure(f"env.name: '{self.name}' went on for {MAX_GAME_MOVES:,} moves in one game without ending "
                             f"it (move {self.steps:,} of this rank); allowed: games that end (terminations or "
                             f"truncations), within {MAX_GAME_MOVES:,} moves")

        def move() -> float:  # (one guarded call a move: the game's step, the learner's reward, whose turn)
            game.step(int(action))
            self.waiting[i] = self._read_turn(i)
            if not a_number(r := held.rewards.get(me, 0.0)):  # (float() would take "1.0" as 1.0)
                raise BadReturn("a reward", r)
            return float(np.asarray(r).reshape(()))
        r = self._call("step()", move)
        if not math.isfinite(r):
            raise EnvFailure(f"env.name: '{self.name}' returned a reward of {r} at move {self.steps:,} of this rank; "
                             f"allowed: finite values")
        self.total[i] += r
        gain[i] += r

    def _read_turn(self, i: int) -> int:
        """Whose move game i waits for now: LEARNER, OPPONENT, or OVER (the game's own code: called inside _call)."""
        held = self.state[i]
        for what, flags in (("a termination", held.terminations), ("a truncation", held.truncations)):
            if not all(map(a_flag, flags.values())):  # (None would read as "not over")
                raise BadReturn(what, next(v for v in flags.values() if not a_flag(v)))
        if any(held.terminations.values()) or any(held.truncations.values()):
            return OVER
        return LEARNER if held.agent_selection == self.me[i] else OPPONENT

    def _settle(self) -> None:
        """The games that ended (the last moves, or a new game's opening moves) counted and begun anew,
        until every game waits for the learner's move."""
        for _ in range(MAX_RESTARTS):
            ended = np.flatnonzero(self.waiting == OVER)
            if len(ended) == 0:
                return
            totals = self.total[ended]
            self.first[ended], self.outcomes[ended] = True, totals
            self.results += zip(ended.tolist(), totals.tolist(), self.turns[ended].tolist())
            if getattr(self.opponent, "per_env", False):
                self.opponent.games_ended(ended, totals)
            self._start(ended)
        raise EnvFailure(f"env.name: '{self.name}': its new games ended in their opening moves {MAX_RESTARTS} times in "
                         f"a row (move {self.steps:,} of this rank); allowed: games the learner gets to play")

    def observe(self):
        return self.rew.copy(), self.obs.copy(), self.first.copy()

    def action_mask(self) -> np.ndarray:
        return self.mask.copy()

    def act(self, actions: np.ndarray) -> None:
        """The learner's moves, then the opponent's until it is the learner's turn again. An illegal
        move (PPO and A2C do not mask) ends the game as the mover's loss, -1, without reaching the
        game: PettingZoo's rule for its classic games, whose raw envs would raise instead."""
        actions = np.asarray(actions, dtype=np.int64)
        self.turns += 1
        illegal = ~self.mask[np.arange(self.num_envs), actions]
        self.illegal_moves += int(illegal.sum())
        gain = np.zeros(self.num_envs, dtype=np.float32)
        for i, a in enumerate(actions):
            if illegal[i]:
                self.waiting[i], self.total[i], gain[i] = OVER, self.total[i] - 1.0, gain[i] - 1.0
            else:
                self._step(i, a, gain)
        self._advance(np.arange(self.num_envs), gain)
        self.rew, self.first = gain, np.zeros(self.num_envs, dtype=bool)
        self._settle()
        self._refresh()

    def episodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(env indices, the learner's totals, its moves) of the games ended since the last call, in the
        order they ended: one env may have ended two in one act (the learner's last move, then the
        opponent's opening moves of the next game), which the `first` flags cannot tell apart."""
        done, self.results = self.results, []
        i, total, turns = zip(*done) if done else ((), (), ())
        return np.asarray(i, dtype=np.int64), np.asarray(total, dtype=np.float64), np.asarray(turns, dtype=np.int64)

    def get_state(self):
        return None  # not exact_resume: a resume starts fresh games

    def set_state(self, state) -> None:
        raise ValueError("a PettingZoo game's state cannot be restored")

    def close(self) -> None:
        said = False
        for game in self.games:  # at the end, the run's results written: a warning (once), not a failure
            try:
                self._call("close()", game.close)
            except EnvFailure as e:
                if not said:
                    sys.stderr.write(f"mpippo: warning: {who()}{e}; ignored\n")
                said = True


def play_games(cfg, policy, opponent, num_games: int, seed: int = 0) -> np.ndarray:
    """(wins, draws, losses) of `policy` against `opponent` (callables (obs, mask) -> actions) over
    `num_games` games of the config's game played side by side, each env's first game counted, the
    policy opening half of them; the outcome is the sign of the policy's total reward."""
    spaces, kind = FAMILY.read(cfg)
    try:
        env = PettingZooVecEnv(cfg, num_games, seed, spaces, kind, opponent, alternate_seats=True)
    except UsageError as e:  # (mid-run, on the learner: a failure of the user's game, not of the run's settings)
        raise EnvFailure(str(e)) from None
    counted = np.zeros(num_games, dtype=bool)
    outcome = np.zeros(num_games, dtype=np.float32)
    while True:
        for i, total in zip(*env.episodes()[:2]):  # each env's first game (its next may end in the same act)
            if not counted[i]:
                counted[i], outcome[i] = True, total
        if counted.all():
            break
        env.act(np.asarray(policy(env.obs, env.mask), dtype=np.int64))
    env.close()
    return np.array([(outcome > 0).sum(), (outcome == 0).sum(), (outcome < 0).sum()], dtype=np.int64)


class PettingZooFamily(EnvFamily):
    name = "pettingzoo"
    exact_resume = False
    static_spaces = False  # a user's game states its spaces on a made game only
    two_player = True
    keys = ("imports", "kwargs")

    def __init__(self):
        self._read: dict = {}

    def accepts(self, name: str) -> bool:
        return isinstance(name, str) and name.startswith(PREFIX)

    def allowed(self) -> str:
        return (", ".join(PREFIX + g for g in GAMES) + " (PettingZoo's classic two-player games), or pz:<name> with "
                "env.import module:callable (your own AEC game)")

    def known_names(self) -> tuple[str, ...]:
        return tuple(PREFIX + g for g in GAMES)

    def symmetric(self, name: str) -> bool:
        return game_of(name) == CONNECT_FOUR

    def heuristics(self, name: str) -> tuple[str, ...]:
        return connect4.FAMILY.heuristics(name) if game_of(name) == CONNECT_FOUR else ("random",)

    def heuristic(self, name: str, which: str, rng: np.random.Generator):
        return connect4.FAMILY.heuristic(name, which, rng)

    def picture(self, frame):
        return connect4.board_picture(frame)  # (planes of two players drawn as the built-in board)

    def play_games(self, cfg, policy, opponent, num_games: int, seed: int) -> np.ndarray:
        if game_of(cfg.env.name) == CONNECT_FOUR:  # the built-in board: the same
            return connect4.play_games(policy, opponent, num_games)  # planes and rules, a hundred times faster
        return play_games(cfg, policy, opponent, num_games, seed)

    def check(self, cfg) -> list[str]:
        game, spec = game_of(cfg.env.name), cfg.env.imports
        if spec is None and game not in GAMES:
            near = difflib.get_close_matches(game, list(GAMES), n=1)
            hint = f" (did you mean '{PREFIX}{near[0]}'?)" if near else ""
            return [f"env.name: '{cfg.env.name[:80]}' is not one of PettingZoo's classic two-player games here{hint}; "
                    f"allowed: {self.allowed()}"]
        if spec is not None:
            module, colon, attr = spec.partition(":")
            if not MODULE.match(module) or not colon or not attr.isidentifier():
                return [f"env.import: '{spec[:80]}' is not module:callable (a function or class of your module that "
                        f"returns a PettingZoo AEC env; PettingZoo has no registry of ids to import)"]
            if not LABEL.match(game):
                return [f"env.name: '{cfg.env.name[:80]}' is not pz:<name> with a name of letters, digits, _ . - "
                        f"(up to 64, a letter first) for the game of env.import"]
            if game in GAMES:
                return [f"env.name: '{cfg.env.name}' is PettingZoo's own game; give the game of env.import '{spec}' a "
                        f"name of its own"]
            if (problem := kwargs_problem(cfg.env.kwargs)) is not None:
                return [problem]
        elif cfg.env.kwargs:
            return [f"env.kwargs: {show(cfg.env.kwargs)[:80]} is for your own game's constructor (env.import); "
                    f"'{cfg.env.name}' takes none"]
        try:
            import pettingzoo  # noqa: F401 (whether it imports, before any game is made)
        except ImportError as e:
            return [f"env.name: '{cfg.env.name}' needs the pettingzoo package, which does not import ({e})"]
        try:
            self.read(cfg)
        except UsageError as e:
            return e.errors
        return []

    def read(self, cfg) -> tuple[Spaces, str]:
        """(spaces, how observations convert) of the config's game, from one game made once per process."""
        key = (cfg.env.name, cfg.env.imports, repr(sorted(cfg.env.kwargs.items())))
        if key not in self._read:
            make = maker(cfg)
            game = None
            try:
                with users_code():
                    game = make(**cfg.env.kwargs)
                    game.reset(seed=0)
                    mover = getattr(game, "agent_selection", None)
                _float32_default()
                self._read[key] = _spaces_of(game, cfg.env.name)
                if mover not in game.possible_agents:  # (its first player, whose turn the batch env asks of it)
                    raise UsageError(f"env.name: '{cfg.env.name}': after reset() its agent_selection is "
                                     f"{show(mover)[:60]}, not one of its agents {list(game.possible_agents)[:2]}; "
                                     f"allowed: an AEC env whose reset() names the player to move")
            except UsageError:
                raise
            except (Exception, SystemExit) as e:  # noqa: BLE001 (the user's game: its constructor, reset or spaces)
                raise UsageError(f"env.name: '{cfg.env.name}': a game cannot be made and read ({_why(e, 160)}"
                                 f"{_where(e)}); allowed: a PettingZoo AEC env of two players") from None
            finally:
                if game is not None:
                    try:
                        with users_code():
                            game.close()
                    except (Exception, SystemExit):  # noqa: BLE001 (said when the run's own games close)
                        pass
        return self._read[key]

    def spaces(self, cfg) -> Spaces:
        return self.read(cfg)[0]

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        return PettingZooVecEnv(cfg, num_envs, seed, *self.read(cfg))

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        schema.need(v is None, path, "expected none (a PettingZoo game's state is not saved)")


FAMILY = PettingZooFamily()
