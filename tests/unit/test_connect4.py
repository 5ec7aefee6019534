"""Connect Four rules against hand-made positions; the vectorized env and its heuristic opponents."""
import numpy as np
import pytest

from mpippo.envs.connect4 import (COLS, ROWS, ConnectFourVecEnv, drop, legal_mask, lookahead_opponent, planes,
                                  random_opponent, wins_at)


def board_from(rows: list[str]) -> np.ndarray:
    """'x' = +1, 'o' = -1, '.' = empty; top row first."""
    assert len(rows) == ROWS and all(len(r) == COLS for r in rows)
    return np.array([[{"x": 1, "o": -1, ".": 0}[ch] for ch in r] for r in rows], dtype=np.int8)[None]


def play(board, col, who):
    rows = drop(board, np.array([col]), np.array([who], dtype=np.int8))
    return bool(wins_at(board, rows, np.array([col]))[0]), int(rows[0])


EMPTY = ["......."] * ROWS


@pytest.mark.parametrize("rows,col,expect", [
    # row: x x x . -> dropping in column 3 wins
    ([*EMPTY[:5], "xxx...."], 3, True),
    # row with a gap filled in the middle
    ([*EMPTY[:5], "xx.x..."], 2, True),
    # column: three x stacked in column 0
    ([*EMPTY[:3], "x......", "x......", "x......"], 0, True),
    # diagonal up-right: x at (5,0), (4,1), (3,2); the stone lands at (2,3)
    ([*EMPTY[:3], "..xo...", ".xoo...", "xooo..."], 3, True),
    # diagonal down-right (anti-diagonal): x at (5,6), (4,5), (3,4); the stone lands at (2,3)
    ([*EMPTY[:3], "...ox..", "...oox.", "...ooox"], 3, True),
    # three in a row is not four
    ([*EMPTY[:5], "xx....."], 2, False),
    # four of the other colour do not count for x
    ([*EMPTY[:5], "ooo...."], 3, False),
])
def test_wins_in_rows_columns_and_both_diagonals(rows, col, expect):
    board = board_from(rows)
    won, _ = play(board, col, 1)
    assert won is expect


def four_through(board: np.ndarray, r: int, c: int) -> bool:
    """The rule read literally: some window of four cells in a line holds (r, c) and only its stone's colour."""
    who = board[r, c]
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for start in range(-3, 1):
            cells = [(r + (start + k) * dr, c + (start + k) * dc) for k in range(4)]
            if all(0 <= y < ROWS and 0 <= x < COLS and board[y, x] == who for y, x in cells):
                return True
    return False


def test_wins_at_agrees_with_the_rule_read_literally_on_random_boards():
    """wins_at gathers the 24 cells of a padded board at once; here every window of four is scanned."""
    rng = np.random.default_rng(7)
    boards = rng.integers(-1, 2, size=(3000, ROWS, COLS)).astype(np.int8)
    rows, cols = rng.integers(0, ROWS, 3000), rng.integers(0, COLS, 3000)
    boards[np.arange(3000), rows, cols] = rng.choice(np.array([-1, 1], dtype=np.int8), 3000)
    expect = np.array([four_through(b, r, c) for b, r, c in zip(boards, rows, cols)])
    assert 100 < expect.sum() < 2900  # both verdicts are well represented
    assert (wins_at(boards, rows, cols) == expect).all()


def test_stone_lands_on_top_and_full_columns_are_masked():
    board = board_from([".x.....", ".o.....", ".x.....", ".o.....", ".x.....", ".o....x"])
    assert legal_mask(board)[0].tolist() == [True, False, True, True, True, True, True]
    _, row = play(board, 6, -1)
    assert row == 4 and board[0, 4, 6] == -1


def test_full_board_without_four_is_a_draw_in_the_env():
    # a known drawn filling, column by column: pattern of pairs that never makes four
    pattern = ["xxoxxox", "ooxooxo", "xxoxxox", "ooxooxo", "xxoxxox", "ooxooxo"]
    board = board_from(pattern)
    for r in range(ROWS):
        for c in range(COLS):
            assert not wins_at(board, np.array([r]), np.array([c]))[0], (r, c)
    assert not legal_mask(board).any()


def test_planes_are_from_the_movers_view():
    board = board_from([*EMPTY[:5], "xo....."])
    p_x, p_o = planes(board, np.array([1])), planes(board, np.array([-1]))
    assert p_x[0, 5, 0, 0] == 255 and p_x[0, 5, 1, 1] == 255
    assert p_o[0, 5, 1, 0] == 255 and p_o[0, 5, 0, 1] == 255


def test_lookahead_wins_if_it_can_and_blocks_otherwise():
    rng = np.random.default_rng(0)
    look = lookahead_opponent(rng)
    win_board = board_from([*EMPTY[:5], "xxx.ooo"])  # mover x can win at 3 (o could too)
    block_board = board_from([*EMPTY[:5], "ooo..xx"])  # o threatens column 3; x to move
    for _ in range(5):
        assert look(planes(win_board, np.array([1])), legal_mask(win_board))[0] == 3
        assert look(planes(block_board, np.array([1])), legal_mask(block_board))[0] == 3


def test_random_opponent_only_picks_legal_columns():
    rng = np.random.default_rng(1)
    board = np.repeat(board_from([".x.x.x."] * ROWS), 50, axis=0)
    cols = random_opponent(rng)(planes(board, np.ones(50, np.int8)), legal_mask(board))
    assert set(cols.tolist()) <= {0, 2, 4, 6} and len(set(cols.tolist())) > 1


def test_env_plays_whole_games_with_outcomes_that_add_up():
    env = ConnectFourVecEnv(16, seed=3, opponent=random_opponent(np.random.default_rng(4)))
    rng = np.random.default_rng(5)
    games, outcomes = 0, np.zeros(3, dtype=np.int64)  # the learner's wins, draws, losses
    for _ in range(400):
        mask = env.action_mask()
        assert mask.any(1).all()  # a game in progress always has a legal move
        env.act(random_opponent(rng)(None, mask))
        rew, obs, first = env.observe()
        assert obs.shape == (16, ROWS, COLS, 2) and obs.dtype == np.uint8
        assert set(np.unique(rew[first])) <= {-1.0, 0.0, 1.0} and not rew[~first].any()
        games += int(first.sum())
        outcomes += [(rew[first] > 0).sum(), (rew[first] == 0).sum(), (rew[first] < 0).sum()]
    w, d, l = outcomes
    assert w + d + l == games > 50 and w > 0 and l > 0
    # who starts alternates: a new game shows an empty board or exactly one opponent stone
    _, obs, first = env.observe()
    stones = (obs[first] > 0).sum(axis=(1, 2, 3))
    assert set(stones.tolist()) <= {0, 1}


def test_an_illegal_move_loses_the_game():
    env = ConnectFourVecEnv(1, seed=0)
    env.board[0, :, 0] = np.array([1, -1, 1, -1, 1, -1])  # a full column, no four anywhere
    env.act(np.array([0]))
    rew, obs, first = env.observe()
    assert rew[0] == -1.0 and first[0] and (obs[0] > 0).sum() <= 1  # lost, and a new game began
