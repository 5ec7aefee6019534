"""The TensorBoard (and W&B) tags: one vocabulary for every algorithm and layout, so the same
quantity has the same tag whether PPO, A2C, APPO or DQN wrote it, and PPO's and APPO's curves plot on
one chart. The losses keep CleanRL's names (losses/policy_loss, losses/value_loss, ...); every writer
takes its tags from here, and `doc()` is the docs' table of them.

An algorithm names the losses it logs in its registry entry (`logs`: quantities of LOSSES); an
update's statistics use the short names of the code (pg_loss, v_loss), which `loss` maps."""
from __future__ import annotations

from mpippo.metrics.timers import LEARNER_PHASES, PHASES

# quantity -> (tag, meaning)
LOSSES = {
    "policy_loss": ("losses/policy_loss", "the clipped surrogate (PPO, APPO) or policy-gradient loss (A2C)"),
    "value_loss": ("losses/value_loss", "the value loss"),
    "entropy": ("losses/entropy", "the policy's entropy"),
    "approx_kl": ("losses/approx_kl", "the approximate KL divergence from the acting policy"),
    "clipfrac": ("losses/clipfrac", "the fraction of samples whose ratio was clipped"),
    "explained_variance": ("losses/explained_variance", "how much of the returns' variance the value explains"),
    "td_loss": ("losses/td_loss", "the mean prioritized double-DQN TD loss of the updates since the last point"),
}
STAT_NAMES = {"pg_loss": "policy_loss", "v_loss": "value_loss"}  # the code's short names

CHARTS = {
    "episode_return": ("charts/episodic_return", "mean return of the episodes finished since the last point"),
    "episode_length": ("charts/episodic_length", "their mean length (sync layout)"),
    "episode_return_mean": ("charts/episode_return_mean", "mean return of the last finished episodes, about 100 (each rank's last ceil(100 / ranks) in sync PPO)"),
    "learning_rate": ("charts/learning_rate", "the learning rate (sync layout)"),
    "skipped_steps": ("charts/skipped_steps", "optimizer steps skipped for a non-finite loss (sync layout)"),
    "steps_per_s": ("charts/steps_per_s", "env steps per second since the last point"),
    "peak_rss_mb_max_rank": ("charts/peak_rss_mb_max_rank", "the largest rank's peak memory, MB (sync layout)"),
}

LEARNER = {
    "updates_per_s": ("learner/updates_per_s", "learner updates per second (actor-learner layout)"),
    "samples_per_s": ("learner/samples_per_s", "samples trained per second"),
    "weight_lag": ("learner/weight_lag", "mean updates between an item's weights and its arrival"),
    "replay_size": ("learner/replay_size", "transitions in the replay (DQN)"),
    "policy_lag_mean": ("learner/policy_lag_mean", "mean policy lag of the segments received, admitted or dropped (16 or more counts as 16) (APPO)"),
    "segments_dropped": ("learner/segments_dropped", "segments dropped as too old, so far (APPO)"),
    "policy_lag": ("learner/policy_lag", "histogram of the policy lags of the interval (APPO)"),
}

# self-play DQN's (<player>: a fixed player of the game, random or lookahead; acting scores also `pool`)
SELFPLAY = {
    "greedy_win_rate": ("selfplay/greedy_win_rate_vs_<player>", "the greedy policy's win rate in the rating games "
                                                                "against a fixed player"),
    "greedy_score": ("selfplay/greedy_score_vs_<player>", "its score there, (wins + draws/2) per game"),
    "acting_score": ("selfplay/acting_score_vs_<player>", "the acting policy's score in the actors' games over the "
                                                          "run, against the pool or a fixed player"),
    "learner_elo": ("selfplay/learner_elo", "the acting policy's Elo rating from the actors' games"),
    "lookahead_elo": ("selfplay/lookahead_elo", "the lookahead player's Elo rating (Connect Four)"),
    "pool_size": ("selfplay/pool_size", "frozen snapshots in the opponent pool"),
    "snapshots": ("selfplay/snapshots", "snapshots taken so far"),
}


# what versions before 2026-11-29 wrote for today's tags (CleanRL's names since): readers of a run's logs try
# both, so runs written earlier still plot and compare
FORMER = {"charts/episodic_return": "charts/episode_return", "charts/episodic_length": "charts/episode_length"}


def readable(tag: str) -> tuple[str, ...]:
    """The tag, then what earlier versions wrote for it: the names a reader of a run's logs looks for."""
    return (tag, FORMER[tag]) if tag in FORMER else (tag,)


def loss(stat: str) -> str:
    """The tag of a loss quantity, by its name or the code's short name (pg_loss, v_loss)."""
    return LOSSES[STAT_NAMES.get(stat, stat)][0]


def chart(name: str) -> str:
    return CHARTS[name][0]


def learner(name: str) -> str:
    return LEARNER[name][0]


def selfplay(name: str, player: str = "") -> str:
    """A self-play tag; `player` for those against a player (greedy_win_rate, greedy_score, acting_score)."""
    return SELFPLAY[name][0].replace("<player>", player)


def phase(name: str) -> str:
    """Seconds of a sync phase (metrics/timers.PHASES) since the last point."""
    return f"time/{name}_s"


def learner_phase(name: str) -> str:
    """Seconds of a learner phase (metrics/timers.LEARNER_PHASES) since the last point."""
    return f"time/learner_{name}_s"


def doc() -> str:
    """The docs' table of the tags."""
    rows = [(tag, meaning) for table in (CHARTS, LOSSES, LEARNER, SELFPLAY) for tag, meaning in table.values()]
    rows += [(phase("<phase>"), f"seconds of each sync phase ({', '.join(PHASES)}) since the last point"),
             (learner_phase("<phase>"), f"seconds of each learner phase ({', '.join(LEARNER_PHASES)})")]
    return "| tag | what |\n|---|---|\n" + "".join(f"| `{t}` | {m} |\n" for t, m in rows)
