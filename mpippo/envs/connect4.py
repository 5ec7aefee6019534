"""Connect Four on a 6x7 board, N games at once in numpy, for self-play.

The rules (`drop`, `wins_at`, `legal_mask`) work on a batch of boards: int8 (N, 6, 7), row 0 at
the top, +1 / -1 for the two players' stones, 0 empty. `ConnectFourVecEnv` wraps them in the
batch interface of the Procgen envs (observe/act, `first` flags) for one learning player
against an opponent policy that moves inside `act`, so to an actor the game is an ordinary
single-player env:

    rew (N,) float32   +1 win, -1 loss (or an illegal move), 0 draw or game on
    obs (N, 6, 7, 2) uint8   planes from the mover's view: own stones, the other's (255 = stone)
    first (N,) bool    obs starts a new game (the previous step ended one)
    mask (N, 7) bool   legal columns (not full), from `action_mask()`

Who moves first alternates per env and game, so the learner plays both sides.
Opponents are callables (obs, mask) -> actions; `random_opponent` and `lookahead_opponent`
(win now if possible, else block the other's immediate win, else random) are the fixed
heuristic opponents used to rate an agent. An opponent that plays different policies in
different envs (a self-play pool, `mpippo.selfplay.OpponentCache`) also has
`per_env = True`: it is called as opponent(obs, mask, envs) with the env indices, and told
`games_ended(envs, rewards)` (the learner's rewards) and `games_started(envs)`, so it can pick
a new policy for each game.

`play_games` pits a policy against an opponent for a fixed number of games (the rating games
of self-play and `mpippo.evaluate --opponent`).
"""
from __future__ import annotations

import numpy as np

from mpippo.envs.family import ArrayStateFamily, Spaces

ROWS, COLS = 6, 7
DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))  # row, column, both diagonals


def legal_mask(board: np.ndarray) -> np.ndarray:
    """(N, 7) bool: columns whose top cell is empty."""
    return board[:, 0, :] == 0


def drop(board: np.ndarray, cols: np.ndarray, player: np.ndarray) -> np.ndarray:
    """Drop one stone of `player[i]` into column `cols[i]` of board i (in place); returns the rows
    it landed in. Every column must be legal."""
    n = np.arange(len(board))
    column = board[n, :, cols]  # (N, 6)
    rows = ROWS - 1 - np.argmax(column[:, ::-1] == 0, axis=1)  # lowest empty cell
    board[n, rows, cols] = player
    return rows


# The 24 cells a line through a stone can use: 4 directions x 2 senses x 1-3 steps away, (4, 2, 3) each.
_K = np.arange(1, 4)
_DR = np.array([[s * dr * _K for s in (1, -1)] for dr, _ in DIRECTIONS])
_DC = np.array([[s * dc * _K for s in (1, -1)] for _, dc in DIRECTIONS])
PAD = 3  # empty cells around the board, so every one of the 24 cells can be read without bounds checks


def wins_at(board: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(N,) bool: the stone just placed at (rows[i], cols[i]) completes four in a line.
    All 24 neighbouring cells in one gather (a loop over them was the self-play actor's hottest
    line): a run in one sense is the stones before the first that is not the player's."""
    n = np.arange(len(board))
    player = board[n, rows, cols]
    padded = np.pad(board, ((0, 0), (PAD, PAD), (PAD, PAD)))  # 0: no player's stone
    r = rows[:, None, None, None] + PAD + _DR
    c = cols[:, None, None, None] + PAD + _DC
    same = padded[n[:, None, None, None], r, c] == player[:, None, None, None]  # (N, 4, 2, 3)
    run = np.logical_and.accumulate(same, axis=3).sum(axis=3)  # (N, 4, 2)
    return (run.sum(axis=2) >= 3).any(axis=1)  # the stone and three more on one line


def planes(board: np.ndarray, mover: np.ndarray) -> np.ndarray:
    """(N, 6, 7, 2) uint8 observation of each board from `mover[i]`'s side."""
    own = board == mover[:, None, None]
    other = board == -mover[:, None, None]
    return (np.stack([own, other], axis=-1) * 255).astype(np.uint8)


def rgb_frame(obs: np.ndarray, cell: int = 32) -> np.ndarray:
    """One observation of a board's two planes (H, W, 2), (6, 7, 2) for Connect Four, as an RGB picture
    for videos: the mover's stones red, the other's yellow, on a blue board; (H * cell, W * cell, 3)
    uint8. Other observations are no board: ValueError."""
    if obs.ndim != 3 or obs.shape[2] != 2:
        raise ValueError(f"an observation of shape {obs.shape} is no board of two planes (H, W, 2) to draw")
    img = np.empty((*obs.shape[:2], 3), dtype=np.uint8)
    img[:] = (30, 60, 170)
    img[obs[..., 0] > 0] = (220, 40, 40)
    img[obs[..., 1] > 0] = (240, 210, 40)
    big = np.repeat(np.repeat(img, cell, axis=0), cell, axis=1)
    big[::cell], big[:, ::cell] = 10, 10  # grid lines
    return big


def board_picture(frame):
    """A two-player game's observation of two planes (H, W, 2) drawn as its board (rgb_frame); a
    picture of the game's own (H, W, 3) as it is."""
    is_board = isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.shape[2] == 2
    return rgb_frame(frame) if is_board else frame


def random_opponent(rng: np.random.Generator):
    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        scores = rng.random(mask.shape) + mask  # legal columns score in [1, 2), illegal in [0, 1)
        return scores.argmax(1)
    return act


def lookahead_opponent(rng: np.random.Generator):
    """One-step lookahead: a winning move if there is one, else block the other's winning move,
    else a random legal column."""
    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        board = obs[..., 0].astype(np.int8) // 255 - obs[..., 1].astype(np.int8) // 255  # +1 = the mover
        # every legal (board, column, player) trial in one batch: 14 per board at most
        b, c, who = np.nonzero(np.broadcast_to(mask[:, :, None], mask.shape + (2,)))
        player = np.array([1, -1], dtype=np.int8)[who]
        trial = board[b]
        rows = drop(trial, c, player)
        wins = np.zeros(mask.shape + (2,), dtype=bool)
        wins[b, c, who] = wins_at(trial, rows, c)
        scores = rng.random(mask.shape) + mask + 2 * wins[..., 1] + 4 * wins[..., 0]
        return scores.argmax(1)
    return act


class ConnectFourVecEnv:
    """N games of the learning player against `opponent`; see the module docstring."""
    PER_ENV = ("board", "me", "agent_first")  # get_state's keys with one row per env (ArrayStateFamily.reshard)

    def __init__(self, num_envs: int, seed: int = 0, opponent=None):
        self.num_envs = num_envs
        self.obs_shape = (ROWS, COLS, 2)
        self.num_actions = COLS
        self.rng = np.random.default_rng(seed)
        self.opponent = opponent or random_opponent(self.rng)
        self.board = np.zeros((num_envs, ROWS, COLS), dtype=np.int8)
        self.me = np.ones(num_envs, dtype=np.int8)  # the learner's colour in each game
        self.agent_first = self.rng.random(num_envs) < 0.5
        self.rew = np.zeros(num_envs, dtype=np.float32)
        self.first = np.ones(num_envs, dtype=bool)
        self.illegal_moves = 0  # by the learning player, ever (each lost its game)
        self._start(np.ones(num_envs, dtype=bool))

    def set_opponent(self, opponent) -> None:
        """Play `opponent` from now on; the games in progress are abandoned (uncounted) and start anew."""
        self.opponent = opponent
        self.rew[:] = 0.0
        self.first[:] = True
        self._start(np.ones(self.num_envs, dtype=bool))

    def _opponent_moves(self, idx: np.ndarray) -> np.ndarray:
        them = -self.me[idx]
        obs, mask = planes(self.board[idx], them), legal_mask(self.board[idx])
        cols = self.opponent(obs, mask, idx) if getattr(self.opponent, "per_env", False) else self.opponent(obs, mask)
        return np.asarray(cols, dtype=np.int64)

    def _start(self, which: np.ndarray) -> None:
        """New games in envs `which`; the opponent moves first where it is its turn to start."""
        self.board[which] = 0
        self.agent_first[which] = ~self.agent_first[which]  # alternate who starts
        self.me[which] = np.where(self.agent_first[which], 1, -1)
        if getattr(self.opponent, "per_env", False):
            self.opponent.games_started(np.flatnonzero(which))
        opp_starts = which & ~self.agent_first
        if opp_starts.any():
            idx = np.flatnonzero(opp_starts)
            self._place(idx, self._opponent_moves(idx), -self.me[idx])

    def _place(self, idx: np.ndarray, cols: np.ndarray, who: np.ndarray) -> np.ndarray:
        sub = self.board[idx]
        rows = drop(sub, cols, who)
        self.board[idx] = sub
        return rows

    def observe(self):
        return self.rew.copy(), planes(self.board, self.me), self.first.copy()

    def action_mask(self) -> np.ndarray:
        return legal_mask(self.board)

    def act(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions, dtype=np.int64)
        n = self.num_envs
        rew = np.zeros(n, dtype=np.float32)
        ended = np.zeros(n, dtype=bool)
        legal = legal_mask(self.board)[np.arange(n), actions]
        rew[~legal], ended[~legal] = -1.0, True  # an illegal move loses the game
        self.illegal_moves += int((~legal).sum())
        idx = np.flatnonzero(legal)
        if len(idx):
            rows = self._place(idx, actions[idx], self.me[idx])
            won = wins_at(self.board[idx], rows, actions[idx])
            rew[idx[won]], ended[idx[won]] = 1.0, True
            full = ~legal_mask(self.board[idx]).any(1) & ~won
            ended[idx[full]] = True
        # the opponent replies where the game goes on
        reply = np.flatnonzero(~ended)
        if len(reply):
            them = -self.me[reply]
            cols = self._opponent_moves(reply)
            ok = legal_mask(self.board[reply])[np.arange(len(reply)), cols]
            rew[reply[~ok]], ended[reply[~ok]] = 1.0, True  # an opponent's illegal move forfeits
            good = reply[ok]
            if len(good):
                rows = self._place(good, cols[ok], them[ok])
                won = wins_at(self.board[good], rows, cols[ok])
                rew[good[won]], ended[good[won]] = -1.0, True
                full = ~legal_mask(self.board[good]).any(1) & ~won
                ended[good[full]] = True
        self.rew, self.first = rew, ended
        if ended.any():
            if getattr(self.opponent, "per_env", False):
                self.opponent.games_ended(np.flatnonzero(ended), rew[ended])
            self._start(ended)

    def get_state(self):
        return {"board": self.board.copy(), "me": self.me.copy(), "agent_first": self.agent_first.copy(),
                "rng": self.rng.bit_generator.state}

    def set_state(self, state) -> None:
        self.board, self.me, self.agent_first = state["board"].copy(), state["me"].copy(), state["agent_first"].copy()
        self.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        pass


def play_games(policy, opponent, num_games: int) -> np.ndarray:
    """(wins, draws, losses) of `policy` against `opponent`, both callables (obs, mask) -> actions,
    over `num_games` games played side by side; `policy` moves first in the even-numbered ones.
    An illegal move loses (neither of ours makes one: both pick among legal columns)."""
    n = num_games
    board = np.zeros((n, ROWS, COLS), dtype=np.int8)
    me = np.where(np.arange(n) % 2 == 0, 1, -1).astype(np.int8)  # +1 moves first
    result = np.zeros(n, dtype=np.int64)  # +1 policy won, -1 lost, 0 draw (or going on)
    live = np.ones(n, dtype=bool)
    mover = np.int8(1)
    while live.any():
        idx = np.flatnonzero(live)
        ours = me[idx] == mover
        for sub, player in ((idx[ours], policy), (idx[~ours], opponent)):
            if not len(sub):
                continue
            who = np.full(len(sub), mover, dtype=np.int8)
            mask = legal_mask(board[sub])
            cols = np.asarray(player(planes(board[sub], who), mask), dtype=np.int64)
            sign = np.where(me[sub] == mover, 1, -1)
            bad = ~mask[np.arange(len(sub)), cols]
            result[sub[bad]], live[sub[bad]] = -sign[bad], False
            good, cols = sub[~bad], cols[~bad]
            if len(good):
                part = board[good]
                rows = drop(part, cols, who[~bad])
                board[good] = part
                won = wins_at(part, rows, cols)
                result[good[won]] = sign[~bad][won]
                live[good[won]] = False
                live[good[~won & ~legal_mask(part).any(1)]] = False  # full board: draw
        mover = np.int8(-mover)
    return np.array([(result > 0).sum(), (result == 0).sum(), (result < 0).sum()], dtype=np.int64)


HEURISTICS = {"random": random_opponent, "lookahead": lookahead_opponent}  # the fixed players, by name


class ConnectFourFamily(ArrayStateFamily):
    name = env_name = "connect4"
    two_player = mirror_symmetric = True

    def env_class(self):
        return ConnectFourVecEnv

    def picture(self, frame):
        return board_picture(frame)

    def heuristics(self, name: str) -> tuple[str, ...]:
        return tuple(HEURISTICS)

    def heuristic(self, name: str, which: str, rng: np.random.Generator):
        return HEURISTICS[which](rng)

    def play_games(self, cfg, policy, opponent, num_games: int, seed: int) -> np.ndarray:
        return play_games(policy, opponent, num_games)

    def spaces(self, cfg) -> Spaces:
        return Spaces((ROWS, COLS, 2), "uint8", COLS)

    def check_state(self, v, path: str, cfg, n: int, schema) -> None:
        array, mapping, pcg64 = schema.array, schema.mapping, schema.pcg64
        mapping(v, path, ("board", "me", "agent_first", "rng"))
        array(v["board"], f"{path}.board", "i", (n, ROWS, COLS))
        array(v["me"], f"{path}.me", "i", (n,))
        array(v["agent_first"], f"{path}.agent_first", "b", (n,))
        pcg64(v["rng"], f"{path}.rng")


FAMILY = ConnectFourFamily()
