"""`pz:<game>`: two-player turn-based games of PettingZoo's AEC API, played as the built-in
Connect Four is (envs/connect4.py): to the learner an ordinary single-player batch env whose
opponent moves inside `act`, so self-play's pool (mpippo/selfplay.py), DQN's action masks and the
rating games work unchanged.

Each of N AEC envs holds one game; the learner takes one seat, alternating which seat moves first
game after game; the opponent is any policy (obs, mask) -> actions, or a per-env one (`per_env`,
told `games_started` and `games_ended`) such as the pool's cache. Observations are PettingZoo's
planes from the mover's view ((6, 7, 2) 0/1 for Connect Four, as uint8 0/255 like the built-in
env's), masks its `action_mask`, the learner's reward its own at the game's end (+1 win, -1 loss,
0 draw); an illegal move ends the game with the mover's loss (PettingZoo's own rule). A game's
state cannot be saved: a resume starts fresh games.
"""
from __future__ import annotations

import importlib
import os

import numpy as np

from mpippo.envs.family import EnvFamily, Spaces

PREFIX = "pz:"
GAMES = {"connect_four_v3": ("pettingzoo.classic.connect_four_v3", (6, 7, 2), 7)}  # name: module, obs, actions


class PettingZooVecEnv:
    def __init__(self, game: str, num_envs: int, seed: int, opponent=None):
        module = _import(game)
        self.num_envs, self.obs_shape, self.num_actions = num_envs, GAMES[game][1], GAMES[game][2]
        self.games = [module.env() for _ in range(num_envs)]
        self.rng = np.random.default_rng(seed)  # the seats, each game's seed, the default opponent
        self.opponent = opponent or _random(self.rng)
        self.agent_first = self.rng.random(num_envs) < 0.5
        self.me = [""] * num_envs
        self.rew = np.zeros(num_envs, dtype=np.float32)
        self.first = np.ones(num_envs, dtype=bool)
        self.illegal_moves = 0
        self.obs = np.zeros((num_envs, *self.obs_shape), dtype=np.uint8)  # the learner's view, after each act
        self.mask = np.ones((num_envs, self.num_actions), dtype=bool)
        self._start(np.arange(num_envs))
        self._refresh()

    def set_opponent(self, opponent) -> None:
        """Play `opponent` from now on; the games in progress are abandoned (uncounted) and start anew."""
        self.opponent = opponent
        self.rew[:] = 0.0
        self.first[:] = True
        self._start(np.arange(self.num_envs))
        self._refresh()

    def _refresh(self) -> None:
        """Every game's view for the learner (its turn in all of them), read once per act."""
        for i in range(self.num_envs):
            self.obs[i], self.mask[i] = self._view(i)

    def _view(self, i: int):
        seen = self.games[i].observe(self.games[i].agent_selection)
        return (seen["observation"].astype(np.uint8) * 255), seen["action_mask"].astype(bool)

    def _start(self, idx: np.ndarray) -> None:
        """New games in envs idx; the opponent moves first where it is its turn to start."""
        if len(idx) == 0:
            return
        for i in idx:
            game = self.games[i]
            game.reset(seed=int(self.rng.integers(2**31 - 1)))
            self.agent_first[i] = not self.agent_first[i]
            self.me[i] = game.possible_agents[0 if self.agent_first[i] else 1]
        if getattr(self.opponent, "per_env", False):
            self.opponent.games_started(np.asarray(idx))
        self._opponents_move(np.asarray([i for i in idx if not self.agent_first[i]], dtype=np.int64))

    def _opponents_move(self, idx: np.ndarray) -> None:
        """The opponent's move in envs idx (all its turn), in one batched call."""
        if len(idx) == 0:
            return
        views = [self._view(i) for i in idx]
        obs, mask = np.stack([v[0] for v in views]), np.stack([v[1] for v in views])
        moves = self.opponent(obs, mask, idx) if getattr(self.opponent, "per_env", False) else self.opponent(obs, mask)
        for i, a in zip(idx, np.asarray(moves, dtype=np.int64)):
            self.games[i].step(int(a))

    def _over(self, i: int) -> bool:
        game = self.games[i]
        return any(game.terminations.values()) or any(game.truncations.values())

    def observe(self):
        return self.rew.copy(), self.obs.copy(), self.first.copy()

    def action_mask(self) -> np.ndarray:
        return self.mask.copy()

    def act(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions, dtype=np.int64)
        self.illegal_moves += int((~self.mask[np.arange(self.num_envs), actions]).sum())
        for i, a in enumerate(actions):
            self.games[i].step(int(a))
        self._opponents_move(np.asarray([i for i in range(self.num_envs) if not self._over(i)], dtype=np.int64))
        ended = np.array([self._over(i) for i in range(self.num_envs)])
        self.rew = np.array([self.games[i].rewards[self.me[i]] if ended[i] else 0.0 for i in range(self.num_envs)],
                            dtype=np.float32)
        self.first = ended
        if ended.any():
            if getattr(self.opponent, "per_env", False):
                self.opponent.games_ended(np.flatnonzero(ended), self.rew[ended])
            self._start(np.flatnonzero(ended))
        self._refresh()

    def get_state(self):
        return None  # not exact_resume: a resume starts fresh games

    def set_state(self, state) -> None:
        raise ValueError("a PettingZoo game's state cannot be restored")

    def close(self) -> None:
        for game in self.games:
            game.close()


def _import(game: str):
    """The game's module, quietly: pygame (PettingZoo's renderer) greets on stdout when imported,
    and PettingZoo prints a warning per illegal move (an illegal move is part of learning here)."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    module = importlib.import_module(GAMES[game][0])
    from pettingzoo.utils.env_logger import EnvLogger
    EnvLogger.suppress_output()
    return module


def _random(rng: np.random.Generator):
    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.array([rng.choice(np.flatnonzero(m)) for m in mask], dtype=np.int64)
    return act


class PettingZooFamily(EnvFamily):
    name = "pettingzoo"
    exact_resume = False
    two_player = True
    mirror_symmetric = True  # (Connect Four, the one game so far)

    def accepts(self, name: str) -> bool:
        return isinstance(name, str) and name.startswith(PREFIX) and name[len(PREFIX):] in GAMES

    def allowed(self) -> str:
        return ", ".join(PREFIX + g for g in GAMES) + " (PettingZoo's classic games, two players)"

    def known_names(self) -> tuple[str, ...]:
        return tuple(PREFIX + g for g in GAMES)

    def check(self, cfg) -> list[str]:
        try:
            _import(cfg.env.name[len(PREFIX):])
        except ImportError as e:
            return [f"env.name: '{cfg.env.name}' needs PettingZoo's classic games, which do not import ({e})"]
        return []

    def spaces(self, cfg) -> Spaces:
        _, obs, actions = GAMES[cfg.env.name[len(PREFIX):]]
        return Spaces(obs, "uint8", actions)

    def make(self, cfg, num_envs: int, seed: int, num_threads: int = 0, render: bool = False):
        return PettingZooVecEnv(cfg.env.name[len(PREFIX):], num_envs, seed)

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        schema.need(v is None, path, "expected none (a PettingZoo game's state is not saved)")


FAMILY = PettingZooFamily()
