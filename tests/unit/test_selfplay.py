"""Self-play parts without MPI: the learner's opponent pool (bound, drop rules, sampling table,
ratings, state), the actor's opponent cache as the env's per-game opponent, and play_games."""
import numpy as np
import pytest
import torch

from mpippo.envs.connect4 import ConnectFourVecEnv, lookahead_opponent, play_games, random_opponent
from mpippo.selfplay import LOOKAHEAD, RANDOM, OpponentCache, OpponentPool, elo_expected


def params(v: float, n: int = 4) -> np.ndarray:
    return np.full(n, v, dtype=np.float32)


def test_pool_is_bounded_drops_the_oldest_and_keeps_frozen_copies():
    pool = OpponentPool(size=3, drop="oldest")
    live = params(0.0)
    for update in range(0, 500, 100):
        live[:] = update  # the learner's weights change in place after a snapshot
        pool.snapshot(update, live)
    assert [m["id"] for m in pool.members] == [2, 3, 4] and pool.dropped == [0, 1]
    assert [m["update"] for m in pool.members] == [200, 300, 400]
    assert [float(m["params"][0]) for m in pool.members] == [200.0, 300.0, 400.0]  # copies, not views
    assert pool.snapshots_taken == 5 and pool.next_id == 5


def test_lowest_rated_drop_never_drops_the_newest():
    pool = OpponentPool(size=2, drop="lowest_rated")
    pool.snapshot(0, params(0))
    pool.learner_rating = 200.0
    pool.snapshot(10, params(1))  # rated 200 at birth
    pool.learner_rating = -500.0  # the newest is the lowest rated
    _, dropped = pool.snapshot(20, params(2))
    assert dropped == [0] and [m["id"] for m in pool.members] == [1, 2]


def test_sampling_tables():
    pool = OpponentPool(size=4, sampling="latest")
    for u in range(3):
        pool.snapshot(u, params(u))
    ids, p = pool.table()
    assert ids.tolist() == [0, 1, 2] and p.tolist() == [0.0, 0.0, 1.0]
    pool.sampling = "uniform"
    assert np.allclose(pool.table()[1], 1 / 3)
    pool.sampling = "prioritized"
    pool.record(0, wins=30, draws=0, losses=0)  # easy opponent
    pool.record(2, wins=0, draws=0, losses=30)  # the one the learner loses to
    _, p = pool.table()
    assert p[2] > p[1] > p[0] > 0 and np.isclose(p.sum(), 1.0)


def test_elo_moves_the_right_way_and_random_is_the_anchor():
    pool = OpponentPool(size=2, elo_k=16)
    pool.snapshot(0, params(0))
    pool.record(RANDOM, wins=10, draws=0, losses=0)
    assert pool.learner_rating > 0 and pool.heuristics[RANDOM]["rating"] == 0.0
    r = pool.learner_rating
    pool.record(LOOKAHEAD, wins=0, draws=0, losses=10)
    assert pool.learner_rating < r and pool.heuristics[LOOKAHEAD]["rating"] > 0
    before = pool.members[0]["rating"]
    pool.record(0, wins=0, draws=4, losses=0)  # draws against a weaker-rated member cost rating
    assert (pool.members[0]["rating"] > before) == (before < pool.learner_rating)
    assert pool.members[0]["wdl"].tolist() == [0, 4, 0]
    assert elo_expected(400, 0) == pytest.approx(10 / 11)
    pool.record(99, wins=5, draws=0, losses=0)  # a member already dropped: not counted
    assert pool.heuristics[RANDOM]["wdl"].tolist() == [10, 0, 0]


def test_pool_state_round_trip():
    pool = OpponentPool(size=2, sampling="prioritized")
    for u in range(3):
        pool.snapshot(u * 10, params(u))
    pool.record(2, 3, 1, 2)
    pool.record(LOOKAHEAD, 1, 0, 5)
    other = OpponentPool(size=2, sampling="prioritized")
    other.load_state_dict(pool.state_dict())
    assert other.summary() == pool.summary()
    assert all(np.array_equal(a["params"], b["params"]) for a, b in zip(pool.members, other.members))
    other.snapshot(30, params(9))
    assert [m["id"] for m in other.members] == [2, 3]  # ids continue after a resume


class TinyNet(torch.nn.Module):
    """uint8 planes in, Q-values out, like DuelingQNetwork."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6 * 7 * 2, 7)

    def forward(self, obs):
        return self.fc(obs.float().flatten(1) / 255.0)


def tiny_net():
    return TinyNet()


def column_net(col: int):
    """A network whose greedy move is always `col` (when legal)."""
    net = tiny_net()
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.fc.bias[col] = 1.0
    return torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy().copy()


def cache_for(num_envs: int, heuristic_prob: float = 0.0, seed: int = 0):
    from contextlib import nullcontext
    rng = np.random.default_rng(seed)
    players = {RANDOM: random_opponent(rng), LOOKAHEAD: lookahead_opponent(rng)}
    return OpponentCache(tiny_net, num_envs, rng, heuristic_prob, max_members=3, precision_ctx=nullcontext,
                         opponent_eps=0.0, players=players)


def test_cache_plays_members_per_game_from_the_table_and_counts_results():
    cache = cache_for(64)
    cache.add(0, column_net(0))
    cache.add(1, column_net(6))
    cache.set_table(np.array([0, 1]), np.array([0.25, 0.75]))
    env = ConnectFourVecEnv(64, seed=3)
    env.set_opponent(cache)
    assert set(cache.playing.tolist()) <= {0, 1}
    rng = np.random.default_rng(1)
    seen, ended = {0: 0, 1: 0}, 0
    for _ in range(400):
        for mid in cache.playing.tolist():
            seen[mid] += 1
        mask = env.action_mask()
        env.act((rng.random(mask.shape) + mask).argmax(1))
        ended += int(env.observe()[2].sum())  # games that ended with this move
    assert 0.6 < seen[1] / (seen[0] + seen[1]) < 0.9  # about 0.75 of the games against member 1
    rows = cache.take_results(10)
    assert sum(r[1] + r[2] + r[3] for r in rows) == ended == cache.games > 100
    assert {r[0] for r in rows} == {0, 1} and env.illegal_moves == 0


def test_cache_members_move_as_their_network_says():
    cache = cache_for(4)
    cache.add(5, column_net(2))
    cache.set_table(np.array([5]), np.array([1.0]))
    env = ConnectFourVecEnv(4, seed=0)
    env.set_opponent(cache)
    board_before = env.board.copy()
    env.act(np.array([6, 6, 6, 6]))  # the learner plays the right edge; the member replies in column 2
    placed = (env.board != 0) & (board_before == 0)
    assert placed[:, :, 2].any(axis=1).all()


def test_cache_keeps_new_members_until_the_table_drops_them():
    cache = cache_for(2)
    cache.add(0, column_net(0))
    assert list(cache.nets) == [0]  # no table yet: kept
    cache.set_table(np.array([0]), np.array([1.0]))
    cache.add(1, column_net(1))  # newer than the table: announced with the next weights
    assert sorted(cache.nets) == [0, 1]
    cache.playing[:] = RANDOM
    cache.set_table(np.array([1]), np.array([1.0]))  # 0 left the pool and nobody plays it
    assert list(cache.nets) == [1]


def test_heuristic_share_of_games():
    cache = cache_for(1000, heuristic_prob=0.3)
    cache.add(0, column_net(3))
    cache.set_table(np.array([0]), np.array([1.0]))
    cache.games_started(np.arange(1000))
    share = np.isin(cache.playing, [RANDOM, LOOKAHEAD]).mean()
    assert 0.25 < share < 0.35 and (cache.playing == LOOKAHEAD).any() and (cache.playing == RANDOM).any()


def test_play_games_counts_and_sides():
    rng = np.random.default_rng(0)
    w, d, l = play_games(lookahead_opponent(rng), random_opponent(rng), 200)
    assert w + d + l == 200 and w > 150  # the lookahead player beats the random one
    firsts = []

    def recorder(obs, mask):
        firsts.append(int(obs.sum()))  # stones on the board when this player moves
        return (rng.random(mask.shape) + mask).argmax(1)
    play_games(recorder, random_opponent(rng), 2)
    assert firsts[0] == 0  # game 0: the policy moves first on an empty board
    stack = column_net(0)  # a column-stacker against itself never makes an illegal move
    net = tiny_net()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(stack), net.parameters())

    def greedy(obs, mask):
        q = net(torch.from_numpy(obs))
        return q.masked_fill(~torch.from_numpy(mask), float("-inf")).argmax(1).numpy()
    assert sum(play_games(greedy, greedy, 4)) == 4


@pytest.mark.parametrize("moves", [7, 130])
def test_mirroring_flips_board_action_and_legal_bits_together_in_the_rows_asked(moves):
    """dqn.mirror_augment's mirror_half_device on a sampled batch's tensors: the rows `flip` names have
    both frames mirrored along the width, action a -> moves-1-a and the next state's legal moves reversed
    (-1, all legal, stays); the other rows are untouched; obs and next_obs stay views of `frames`. (130
    moves: the legal moves in three words.)"""
    from mpippo.algos.dqn import mirror_half_device
    from mpippo.envs import bits_to_mask, mask_bits
    rng = np.random.default_rng(0)
    n = 64
    frames = torch.from_numpy(rng.integers(0, 2, size=(2 * n, 6, 7, 2)).astype(np.uint8) * 255)
    legal = rng.random((n, moves)) < 0.7
    bits = np.where(rng.random((n, 1)) < 0.2, -1, mask_bits(legal))
    batch = {"frames": frames.clone(), "actions": torch.from_numpy(rng.integers(moves, size=n)),
             "next_legal": torch.from_numpy(bits)}
    orig = {k: v.clone() for k, v in batch.items()}
    flip = torch.from_numpy(rng.random(n) < 0.5)
    out = mirror_half_device(batch, flip, moves)
    assert 10 < int(flip.sum()) < n - 10
    assert torch.equal(out["obs"], out["frames"][:n]) and torch.equal(out["next_obs"], out["frames"][n:])
    for i in range(n):
        f = bool(flip[i])
        for row in (i, n + i):
            assert torch.equal(out["frames"][row], orig["frames"][row].flip(1) if f else orig["frames"][row])
        assert int(out["actions"][i]) == (moves - 1 - int(orig["actions"][i]) if f else int(orig["actions"][i]))
        if (bits[i] == -1).all() or not f:
            assert out["next_legal"][i].tolist() == bits[i].tolist()
        else:
            assert (bits_to_mask(out["next_legal"][i:i + 1].numpy(), moves)[0] == legal[i][::-1]).all()


def test_scores_against_the_pool_and_each_heuristic():
    pool = OpponentPool(size=3)
    pool.snapshot(0, params(0))
    pool.snapshot(1, params(1))
    assert pool.scores() == {}
    pool.record(0, wins=2, draws=0, losses=0)
    pool.record(1, wins=0, draws=2, losses=0)
    pool.record(RANDOM, wins=3, draws=0, losses=1)
    assert pool.scores() == {"pool": 0.75, "random": 0.75}


def test_the_metrics_block_of_a_long_run_stays_bounded_and_keeps_both_ends():
    """One row a rating round and one id a drop had grown benchmark_metrics.json past what its readers take
    (64 MiB at about 184,000 rounds); the block keeps SUMMARY_ROWS of each, the curve's first and last."""
    from mpippo.selfplay import SUMMARY_ROWS, thinned
    rows = [{"update": u} for u in range(10 * SUMMARY_ROWS + 7)]
    kept = thinned(rows, SUMMARY_ROWS)
    assert len(kept) == SUMMARY_ROWS and kept[0] is rows[0] and kept[-1] is rows[-1]
    assert [r["update"] for r in kept] == sorted({r["update"] for r in kept})  # in order, none twice
    assert thinned(rows[:5], SUMMARY_ROWS) == rows[:5]
