"""Self-play for two-player games in the DQN learner layout: an opponent pool on the learner,
a cache of opponent networks on each actor, and ratings.

Learner (`OpponentPool`): every `selfplay.snapshot_interval_updates` updates it freezes a copy
of its network as a new pool member (member 0 is the network it starts from). The pool holds at
most `selfplay.pool_size` members; beyond that the oldest, or the lowest-rated, is dropped (never
the newest). Each member is shipped once to every actor (tag SNAPSHOT, non-blocking); with every
weight sync the learner also sends the sampling table: member ids and the probability of facing
each. `sampling` sets the table:

    latest       the newest member only (plain self-play)
    uniform      every member alike (fictitious self-play)
    prioritized  p_i ~ (loss rate of the learner against i) ** priority_exponent, the loss rate a
                 running average (loss 1, draw 0.5, win 0) that follows the learner's progress

Actor (`OpponentCache`): the env's opponent. For each new game it draws a member from the table
(or, with probability `heuristic_prob`, one of the game's fixed players: random, and on Connect Four
the one-step lookahead player), plays it
through its own inference copy (greedy, with a random legal move at rate `opponent_eps`), and counts the learner's wins, draws and losses per
opponent; the counts ride to the learner in the chunk messages.

Ratings: the learner turns those counts into win/draw/loss totals per opponent and an Elo rating
(K = `elo_k`, one update per game) for itself, every member and the fixed players; the random
player is the anchor at 0. These are the ratings of the acting (epsilon-greedy) policy. The
learner also plays `eval_games` greedy games against each fixed player every
`eval_interval_updates` updates: the win-rate curve.
"""
from __future__ import annotations

import numpy as np
import torch

from mpippo import ckpt_schema as schema
from mpippo import envs
from mpippo.metrics import tags

RANDOM, LOOKAHEAD = -1, -2  # opponent ids of the heuristic players; pool members have ids >= 0
ILLEGAL = -3  # results row of an actor's illegal moves (count in the wins column); should stay 0
HEURISTICS = {RANDOM: "random", LOOKAHEAD: "lookahead"}
IDS = {name: i for i, name in HEURISTICS.items()}


def heuristic_players(cfg, rng: np.random.Generator) -> dict:
    """The game's fixed players by id (random for every game; lookahead where Connect Four's rules are
    the game's), each a policy (obs, mask) -> actions."""
    fam = envs.family(cfg)
    return {IDS[name]: fam.heuristic(cfg.env.name, name, rng) for name in fam.heuristics(cfg.env.name)}


def elo_expected(r_a: float, r_b: float) -> float:
    """Expected score of a player rated r_a against one rated r_b. Beyond 300 x 400 points apart the
    score is 0 or 1 to double precision; the exponent stops there (10 ** 309 would overflow)."""
    return 1.0 / (1.0 + 10.0 ** min(max((r_b - r_a) / 400.0, -300.0), 300.0))


class OpponentPool:
    """The learner's pool of frozen snapshots, their statistics and the ratings."""

    def __init__(self, size: int, sampling: str = "uniform", drop: str = "oldest", elo_k: float = 16.0,
                 priority_exponent: float = 1.0, loss_rate_decay: float = 0.05, heuristics=tuple(HEURISTICS)):
        self.size, self.sampling, self.drop = size, sampling, drop
        self.elo_k, self.priority_exponent, self.decay = elo_k, priority_exponent, loss_rate_decay
        self.members: list[dict] = []  # {id, update, params, wdl, rating, loss_rate}
        self.next_id = 0
        self.learner_rating = 0.0
        self.heuristics = {i: {"wdl": np.zeros(3, dtype=np.int64), "rating": 0.0} for i in heuristics}
        self.dropped: list[int] = []

    def snapshot(self, update: int, params: np.ndarray) -> tuple[dict, list[int]]:
        """Freeze `params` as a new member; returns it and the ids dropped to keep the bound."""
        member = {"id": self.next_id, "update": update, "params": np.array(params, dtype=np.float32, copy=True),
                  "wdl": np.zeros(3, dtype=np.int64), "rating": self.learner_rating, "loss_rate": 0.5}
        self.next_id += 1
        self.members.append(member)
        return member, self._trim()

    def _trim(self) -> list[int]:
        """Drop members beyond the bound (the drop rule's, never the newest); their ids."""
        dropped = []
        while len(self.members) > self.size:
            older = self.members[:-1]  # never the newest
            victim = older[0] if self.drop == "oldest" else min(older, key=lambda m: (m["rating"], m["id"]))
            self.members.remove(victim)
            dropped.append(victim["id"])
        self.dropped += dropped
        return dropped

    @property
    def snapshots_taken(self) -> int:
        """Every snapshot got the next id, so the count is the next id."""
        return self.next_id

    def member(self, mid: int) -> dict | None:
        return next((m for m in self.members if m["id"] == mid), None)

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probabilities) of the members actors should face."""
        ids = np.array([m["id"] for m in self.members], dtype=np.int64)
        if self.sampling == "latest":
            p = (ids == ids.max()).astype(np.float64)
        elif self.sampling == "uniform":
            p = np.ones(len(ids))
        else:
            p = np.array([m["loss_rate"] for m in self.members]) ** self.priority_exponent + 1e-3
        return ids, p / p.sum()

    def record(self, opponent: int, wins: int, draws: int, losses: int) -> None:
        """Games the learner played against `opponent` (a member id or a heuristic); games against
        members already dropped are not counted."""
        entry = self.heuristics.get(opponent) or self.member(opponent)
        if entry is None:
            return
        entry["wdl"] += (wins, draws, losses)
        for score, n in ((1.0, wins), (0.5, draws), (0.0, losses)):
            for _ in range(int(n)):
                delta = self.elo_k * (score - elo_expected(self.learner_rating, entry["rating"]))
                self.learner_rating += delta
                if opponent != RANDOM:  # the anchor stays at 0
                    entry["rating"] -= delta
                if "loss_rate" in entry:
                    entry["loss_rate"] += self.decay * ((1.0 - score) - entry["loss_rate"])

    def scores(self) -> dict:
        """The learner's score (wins + draws / 2) / games against the current pool (all members
        together) and each heuristic player, over the games so far; opponents not yet met are left out."""
        out = {}
        for name, wdl in [("pool", sum((m["wdl"] for m in self.members), np.zeros(3, dtype=np.int64)))] + [
                (HEURISTICS[i], h["wdl"]) for i, h in self.heuristics.items()]:
            if wdl.sum():
                out[name] = float((wdl[0] + 0.5 * wdl[1]) / wdl.sum())
        return out

    STATE = ("members", "next_id", "learner_rating", "heuristics", "dropped")  # state_dict's keys (checked: check_state)

    def state_dict(self) -> dict:
        return {"members": [dict(m, params=m["params"].copy(), wdl=m["wdl"].copy()) for m in self.members],
                "next_id": self.next_id, "learner_rating": self.learner_rating,
                "heuristics": {i: {"wdl": h["wdl"].copy(), "rating": h["rating"]} for i, h in self.heuristics.items()},
                "dropped": list(self.dropped)}

    def load_state_dict(self, st: dict) -> None:
        self.members = [dict(m, params=np.asarray(m["params"], dtype=np.float32).copy(), wdl=np.asarray(m["wdl"]).copy())
                        for m in st["members"]]
        self.next_id, self.learner_rating = int(st["next_id"]), float(st["learner_rating"])
        self.heuristics = {int(i): {"wdl": np.asarray(h["wdl"]).copy(), "rating": float(h["rating"])}
                           for i, h in st["heuristics"].items()}
        self.dropped = list(st["dropped"])
        self._trim()  # (a resume with a smaller selfplay.pool_size: the sampling table holds pool_size ids)

    def summary(self) -> dict:
        """JSON-ready ratings and results (benchmark_metrics.json)."""
        def row(wdl, rating, **kw):
            n = int(wdl.sum())
            return dict(kw, wins=int(wdl[0]), draws=int(wdl[1]), losses=int(wdl[2]), games=n,
                        score=float((wdl[0] + 0.5 * wdl[1]) / n) if n else None, elo=round(float(rating), 1))
        ids, p = self.table()
        prob = dict(zip(ids.tolist(), p.tolist()))
        return {"learner_elo": round(self.learner_rating, 1), "sampling": self.sampling, "pool_size": len(self.members),
                "snapshots_taken": self.snapshots_taken, "dropped": list(self.dropped),
                "pool": [row(m["wdl"], m["rating"], id=m["id"], update=m["update"], p=round(prob[m["id"]], 4))
                         for m in self.members],
                "heuristics": {HEURISTICS[i]: row(h["wdl"], h["rating"]) for i, h in self.heuristics.items()}}


class OpponentCache:
    """The actor's opponent (the connect4 env's per-env opponent protocol): inference copies of
    pool members, one drawn per game from the learner's table."""

    per_env = True

    def __init__(self, make_net, num_envs: int, rng: np.random.Generator, heuristic_prob: float,
                 max_members: int, precision_ctx, opponent_eps: float, players: dict):
        self.make_net, self.rng, self.heuristic_prob = make_net, rng, heuristic_prob
        self.opponent_eps = opponent_eps
        self.max_members = max_members
        self.precision_ctx = precision_ctx
        self.nets: dict[int, torch.nn.Module] = {}
        self.ids = np.zeros(0, dtype=np.int64)
        self.probs = np.zeros(0)
        self.heuristic = players  # the game's fixed players by id (heuristic_players)
        self.playing = np.full(num_envs, RANDOM, dtype=np.int64)  # opponent id per env
        self.results: dict[int, np.ndarray] = {}  # id -> (wins, draws, losses) not yet reported
        self.games = 0

    def add(self, mid: int, flat_params: np.ndarray) -> None:
        net = self.make_net()
        torch.nn.utils.vector_to_parameters(torch.from_numpy(flat_params), net.parameters())
        net.eval()
        self.nets[mid] = net
        self._evict()

    def set_table(self, ids: np.ndarray, probs: np.ndarray) -> None:
        self.ids, self.probs = ids.astype(np.int64), probs.astype(np.float64)
        self._evict()

    def _evict(self) -> None:
        """Drop nets that left the pool, unless a game in progress still uses them; keep at most
        max_members. Ids grow and the pool keeps its newest member, so a net newer than the table's
        newest has only not been announced yet."""
        newest = int(self.ids.max()) if len(self.ids) else -1
        keep = set(self.ids.tolist()) | set(self.playing.tolist())
        for mid in [m for m in self.nets if m not in keep and m < newest]:
            del self.nets[mid]
        while len(self.nets) > self.max_members:  # table not here yet: keep the newest
            unused = [m for m in sorted(self.nets) if m not in set(self.playing.tolist())]
            if not unused:
                break
            del self.nets[unused[0]]

    def games_started(self, envs: np.ndarray) -> None:
        n = len(envs)
        have = np.isin(self.ids, list(self.nets))
        pick = np.full(n, RANDOM, dtype=np.int64)
        if have.any():
            p = self.probs[have] / self.probs[have].sum() if self.probs[have].sum() > 0 else None
            pick = self.rng.choice(self.ids[have], size=n, p=p)
        heur = self.rng.random(n) < (self.heuristic_prob if have.any() else 1.0)
        pick[heur] = self.rng.choice(list(self.heuristic), size=int(heur.sum()))
        self.playing[envs] = pick

    def games_ended(self, envs: np.ndarray, rewards: np.ndarray) -> None:
        for mid, r in zip(self.playing[envs].tolist(), rewards.tolist()):
            out = self.results.setdefault(mid, np.zeros(3, dtype=np.int64))
            out[0 if r > 0 else 1 if r == 0 else 2] += 1
            self.games += 1

    def take_results(self, max_rows: int) -> list[tuple[int, int, int, int]]:
        """Up to max_rows (id, wins, draws, losses) rows not yet reported; the rest stay for later."""
        rows = []
        for mid in list(self.results)[:max_rows]:
            w, d, l = self.results.pop(mid)
            rows.append((mid, int(w), int(d), int(l)))
        return rows

    def __call__(self, obs: np.ndarray, mask: np.ndarray, envs: np.ndarray) -> np.ndarray:
        who = self.playing[envs]
        out = np.zeros(len(envs), dtype=np.int64)
        for mid in np.unique(who):
            sel = who == mid
            if mid in self.heuristic:
                out[sel] = self.heuristic[mid](obs[sel], mask[sel])
                continue
            with torch.inference_mode(), self.precision_ctx():
                q = self.nets[mid](torch.from_numpy(obs[sel])).float()
            out[sel] = q.masked_fill(~torch.from_numpy(mask[sel]), float("-inf")).argmax(1).numpy()
        if self.opponent_eps:  # members explore a little, so a game is not one fixed line to exploit
            explore = (who >= 0) & (self.rng.random(len(envs)) < self.opponent_eps)
            out[explore] = (self.rng.random(mask.shape) + mask)[explore].argmax(1)
        return out

    def summary(self) -> dict:
        return {"cached": sorted(self.nets), "games": self.games}


SUMMARY_ROWS = 2000  # rating rounds and dropped ids in benchmark_metrics.json (a curve needs no more)


def thinned(rows: list, limit: int) -> list:
    """At most `limit` of `rows`, evenly spread over them, the first and the last among them."""
    if len(rows) <= limit:
        return list(rows)
    keep = np.unique(np.linspace(0, len(rows) - 1, limit).round().astype(int))
    return [rows[i] for i in keep]


class LearnerHook:
    """Self-play on the learner of the actor-learner layout: the pool, its snapshots and sampling
    table, the game results from the chunks, the rating games, and their part of checkpoints,
    TensorBoard and the summary. `policy(obs, mask) -> actions` is the learner's greedy policy."""

    def __init__(self, cfg, policy, seed: int):
        self.cfg, self.sp, self.policy, self.seed = cfg, cfg.selfplay, policy, seed
        sp, self.names = self.sp, envs.family(cfg).heuristics(cfg.env.name)
        self.pool = OpponentPool(sp.pool_size, sp.sampling, sp.drop, sp.elo_k, sp.priority_exponent,
                                 heuristics=[IDS[n] for n in self.names])
        self.ratings: list[dict] = []  # greedy games against the heuristic players, one row per round
        self.illegal_moves = 0  # illegal moves the actors made (masking makes it 0)
        self.writer = None

    @property
    def table_size(self) -> int:
        return 1 + 2 * self.sp.pool_size

    def table(self) -> np.ndarray:
        """The opponent sampling table for the actors: [n, ids (pool_size slots), probabilities]."""
        ids, p = self.pool.table()
        out = np.zeros(self.table_size)
        out[0] = len(ids)
        out[1:1 + len(ids)], out[1 + self.sp.pool_size:1 + self.sp.pool_size + len(ids)] = ids, p
        return out

    def start(self, send_snapshot, weights: np.ndarray, updates: int, transitions: int) -> None:
        """Every actor gets the whole pool (a resumed one), or member 0 (the starting network)."""
        if self.pool.members:
            for m in self.pool.members:
                send_snapshot(m["id"], m["params"])
        else:
            member, _ = self.pool.snapshot(updates, weights)
            send_snapshot(member["id"], member["params"])
        if not self.ratings:
            self.rate(updates, transitions)

    def record(self, results: np.ndarray) -> None:
        for mid, w_, d_, l_ in results:
            if mid == ILLEGAL:
                self.illegal_moves += int(w_)
            elif w_ or d_ or l_:
                self.pool.record(int(mid), int(w_), int(d_), int(l_))

    def after_update(self, updates: int, transitions: int, send_snapshot, weights) -> None:
        if updates % self.sp.snapshot_interval_updates == 0:
            member, _ = self.pool.snapshot(updates, weights())
            send_snapshot(member["id"], member["params"])
        if self.sp.eval_interval_updates and updates % self.sp.eval_interval_updates == 0:
            self.rate(updates, transitions)

    def rate(self, updates: int, transitions: int) -> None:
        """Greedy rating games against the heuristic players (the win-rate curve)."""
        rng = np.random.default_rng(self.seed + len(self.ratings))
        row = {"update": updates, "transitions": transitions, "elo": round(self.pool.learner_rating, 1)}
        fam, name_ = envs.family(self.cfg), self.cfg.env.name
        for name, opp in ((n, fam.heuristic(name_, n, rng)) for n in self.names):
            w_, d_, l_ = (int(x) for x in fam.play_games(self.cfg, self.policy, opp, self.sp.eval_games,
                                                        self.seed + 7919 * len(self.ratings) + 1))  # (not rng's)
            row[name] = {"wins": w_, "draws": d_, "losses": l_, "win_rate": w_ / self.sp.eval_games,
                         "score": (w_ + 0.5 * d_) / self.sp.eval_games}
            if self.writer is not None:
                self.writer.add_scalar(tags.selfplay("greedy_win_rate", name), w_ / self.sp.eval_games, transitions)
                self.writer.add_scalar(tags.selfplay("greedy_score", name), row[name]["score"], transitions)
        self.ratings.append(row)

    def finish(self, updates: int, transitions: int) -> None:
        if self.ratings[-1]["update"] != updates:
            self.rate(updates, transitions)  # the final rating

    def log(self, x: int) -> None:
        """Ratings of the acting policy, from the actors' games."""
        w, pool = self.writer, self.pool
        w.add_scalar(tags.selfplay("learner_elo"), pool.learner_rating, x)
        if LOOKAHEAD in pool.heuristics:  # (games with that player: Connect Four's)
            w.add_scalar(tags.selfplay("lookahead_elo"), pool.heuristics[LOOKAHEAD]["rating"], x)
        w.add_scalar(tags.selfplay("pool_size"), len(pool.members), x)
        w.add_scalar(tags.selfplay("snapshots"), pool.snapshots_taken, x)
        for name, score in pool.scores().items():  # (W + D/2) / games, over the run
            w.add_scalar(tags.selfplay("acting_score", name), score, x)

    def console(self) -> str:
        last = self.ratings[-1]
        return (f" | elo {self.pool.learner_rating:6.0f} | pool {len(self.pool.members)} | greedy vs "
                + ", ".join(f"{n} {last[n]['win_rate']:.2f}" for n in self.names))

    def state_dict(self) -> dict:
        return {"pool": self.pool.state_dict(), "ratings": list(self.ratings)}

    @staticmethod
    def check_state(st, net) -> None:
        """What state_dict wrote, as a checkpoint holds it (its `selfplay` entry), before it is loaded:
        the keys, and each member's weights of the network's size (ckpt_schema's primitives)."""
        sp = schema.mapping(st, "selfplay", ("pool", "ratings"))
        pool = schema.mapping(sp["pool"], "selfplay.pool", OpponentPool.STATE)
        n_params = sum(p.numel() for p in net.parameters())
        for i, m in enumerate(schema.seq(pool["members"], "selfplay.pool.members")):
            schema.mapping(m, f"selfplay.pool.members[{i}]", ("id", "params", "wdl"))
            schema.array(m["params"], f"selfplay.pool.members[{i}].params", "f", (n_params,))

    def load_state_dict(self, st: dict) -> str:
        self.pool.load_state_dict(st["pool"])
        self.ratings = list(st["ratings"])
        return f"; restored opponent pool of {len(self.pool.members)} (ids {[m['id'] for m in self.pool.members]})"

    def summary(self) -> dict:
        """The metrics file's block: at most SUMMARY_ROWS rating rounds (evenly spread, the first and last
        kept) and the last SUMMARY_ROWS dropped ids with their count. One row a round and one id a drop
        had grown a long run's file past what its readers take (64 MiB: 184,000 rounds); the checkpoint
        and TensorBoard keep every round."""
        out = dict(self.pool.summary(), ratings=thinned(self.ratings, SUMMARY_ROWS), illegal_moves=self.illegal_moves)
        out["dropped_count"], out["dropped"] = len(out["dropped"]), out["dropped"][-SUMMARY_ROWS:]
        return out

    def closing_line(self, agent: int) -> str:
        first, last = self.ratings[0], self.ratings[-1]
        rates = ", vs ".join(f"{n} {first[n]['win_rate']:.2f} -> {last[n]['win_rate']:.2f}" for n in self.names)
        return (f"mpippo: agent {agent} self-play: {self.pool.snapshots_taken} snapshots, pool "
                f"{[m['id'] for m in self.pool.members]}, elo {self.pool.learner_rating:.0f}; greedy win rate vs "
                f"{rates} ({self.sp.eval_games} games each)")


class ActorHook:
    """Self-play on an actor: the env's opponent is an OpponentCache fed with the learner's
    snapshots and sampling table; each chunk carries the game results not yet reported."""

    def __init__(self, sp, cache: OpponentCache, env):
        self.sp, self.cache, self.env = sp, cache, env
        self.illegal_reported = 0

    def receive(self, snapshots: list, table: np.ndarray | None) -> None:
        for mid, params in snapshots:
            self.cache.add(mid, params)
        if table is not None:
            n, size = int(table[0]), self.sp.pool_size
            self.cache.set_table(table[1:1 + n], table[1 + size:1 + size + n])

    def ready(self) -> bool:
        """Play only once the first pool member arrived; then the env faces the cache."""
        if not self.cache.nets:
            return False
        self.env.set_opponent(self.cache)
        return True

    def pending(self) -> bool:
        return bool(self.cache.results)

    def stamp(self, results: np.ndarray) -> None:
        """Fill a chunk's results rows: game results per opponent, and one row of illegal moves."""
        results[:] = 0
        rows = self.cache.take_results(len(results) - 1)
        if rows:
            results[:len(rows)] = rows
        illegal, self.illegal_reported = self.env.illegal_moves - self.illegal_reported, self.env.illegal_moves
        results[-1] = (ILLEGAL, illegal, 0, 0)

    def summary(self) -> dict:
        return {"opponents": self.cache.summary()}
