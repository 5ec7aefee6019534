"""The keys every run's benchmark_metrics.json holds, whatever its algorithm and layout: one list,
documented here and in docs/outputs.md (`make_doc` writes that list), and tested against both
layouts' files. files.write_metrics is the file's one writer (both layouts hand it their values; it
checks them against these tables, `problems`, and writes the file atomically), files.read_metrics its
reader (it checks the typed keys of these tables). Layouts add their own keys beside these (PPO:
phases; actor-learner: the learner's rates and the actors' counts); those a test or a tool relies on
are listed here per layout (SYNC_PPO, ACTOR_LEARNER), in the same form, and docs/outputs.md lists
them with `make_doc`."""
from __future__ import annotations


# why a run stopped, in increasing urgency: a job ends with its parts' most urgent (mpippo/runctl.py)
STOP_REASONS = ("done", "duration", "stopped", "requeue", "failed")

# key: (type, meaning). "number" is an int or float; "?" allows null.
COMMON = {
    "algo": ("str", "the algorithm (training.algo: ppo, a2c, appo, dqn)"),
    "env": ("str", "the environment"),
    "world_size": ("int", "ranks in the job"),
    "num_envs_per_rank": ("int", "envs on each env-stepping rank (PPO: every rank; actor-learner: each actor)"),
    "total_timesteps": ("int", "env steps reached (the actor-learner layout: this agent's)"),
    "target_timesteps": ("int", "the budget of env steps (an agent's share of it)"),
    "duration_s": ("number", "seconds of training in this process (since the last start or resume)"),
    "fps": ("number", "env steps per second over that time"),
    "fps_steady": ("number?", "the same from the first logged point on (start-up excluded)"),
    "episode_return_mean": ("number?", "mean return of the last finished episodes, about 100: each rank's last ceil(100 / ranks) (sync PPO; an agent's last 100 in the actor-learner layouts)"),
    "episodes": ("int", "episodes finished"),
    "peak_rss_mb_per_rank": ("list", "peak resident memory of each rank (kernel high-water mark), MB; "
                                     "actor-learner: the learner first, then its actors"),
    "peak_rss_mb_total": ("number", "their sum"),
    "finished": ("bool", "the budget was reached"),
    "stop_reason": ("str?", f"{', '.join(STOP_REASONS[:-1])} or {STOP_REASONS[-1]} (null while running)"),
    "device_used": ("str", "the device that trained (PPO: every rank's; actor-learner: the learner's)"),
    "precision": ("str", "fp32 or bf16, as resolved"),
    "deterministic": ("bool", "training.deterministic (deterministic GPU kernels)"),
    "threads_per_rank": ("int", "torch threads of a (PPO or learner) rank"),
    "affinity_cores": ("int", "cores in that rank's affinity mask"),
    "cpu_share": ("int", "its share of them (the mask over the ranks that share it)"),
    "env_threads": ("int", "env threads given to each env-stepping rank's envs (procgen's: 0, the rank's own thread; "
                           "ale-py runs at least one)"),
    "host_allocator": ("str", "how freed host memory is handled (mpippo/hostmem.py)"),
    "git_commit": ("str?", "the code's commit"),
}

_Q = "quantiles {p50, p90, p99, max} over"
# Sync PPO only: its ranks step in lockstep, so an iteration's time is set by its slowest rank
# (mpippo/metrics/timers.py says how each part is measured). Null before the first iteration.
SYNC_PPO = {
    "n_steps": ("int", "rollout steps per env (training.n_steps)"),
    "iterations": ("int", "iterations done (rollout and update)"),
    "phase_seconds": ("dict", "seconds per phase (mpippo/metrics/timers.py: PHASES), mean over ranks"),
    "phase_seconds_per_rank": ("dict", "the same per phase, one value per rank"),
    "allreduce_bytes": ("int", "bytes of the flat gradient each Allreduce sums"),
    "allreduce_calls_per_iteration": ("int", "gradient Allreduces per iteration"),
    "straggler_rollout_s": ("dict?", f"{_Q} every rank's iterations of the rollout seconds (env_step + inference)"),
    "straggler_update_s": ("dict?", f"{_Q} the same of the update seconds (backward + optimizer)"),
    "straggler_wait_s": ("dict?", f"{_Q} the same of the wait in collectives: a rank's seconds in the phases "
                                  "that hold them (gae, allreduce) minus the iteration's smallest over the ranks "
                                  "(a lower bound)"),
    "straggler_transfer_s": ("dict?", f"{_Q} iterations of that smallest time (transfer, no wait)"),
    "straggler_spread": ("dict?", f"{_Q} iterations of the slowest rank's busy time (rollout + update) over "
                                  "the mean over ranks (1: even ranks)"),
    "straggler_busy_rel": ("list?", "busy time over the iteration's mean over ranks, its quantiles at "
                                    "probabilities 0, 0.01, ..., 0.99, 0.995, 0.999, 1 (the scaling model's input)"),
    "straggler_slowest_rank": ("int?", "the rank slowest in the most iterations"),
    "straggler_slowest_counts": ("list?", "per rank, the iterations in which it was the slowest"),
    "straggler_busy_p50_s_per_rank": ("list?", "per rank, the median busy seconds per iteration"),
    "straggler_iterations": ("int", "iterations behind these numbers (an even sample of the run when it is long)"),
    "straggler_lost": ("int", "iterations not seen (more than 32 between two reports: logging.log_interval)"),
    "policy_step": ("str", "the rollout's policy step: graph (replayed as a CUDA graph, training.cuda_graph) or eager"),
    "rollout_cutoff": ("dict?", "the balanced cut-off (training.rollout_cutoff; null when off): ranks_needed, "
                                "iterations, iterations_cut, mean_share_collected and least_share_collected "
                                "(a rank's steps over n_steps)"),
}

# The actor-learner layout's learner (mpippo/layout/learner.py), per agent.
ACTOR_LEARNER = {
    "phase_seconds": ("dict", "the learner's seconds per phase over the segment: ingest (chunks into the "
                              "algorithm's buffers), wait (no data to train on: credit granted, polling), update, "
                              "send (weights, pool members), checkpoint, log, other (mpippo/metrics/timers.py)"),
    "phase_share": ("dict", "each phase's share of duration_s (wait near 0: the learner holds the actors back)"),
    "learner_updates_per_s": ("number", "learner updates per second"),
    "learner_samples_per_s": ("number", "samples trained per second (updates x batch)"),
    "weight_lag": ("number", "mean learner updates between the weights an item was collected under and its arrival"),
    "transitions_sent": ("int", "env steps the actors sent"),
    "transitions_received": ("int", "env steps the learner received (equal at the end)"),
    "updates": ("int", "learner updates done"),
    "node_cpus": ("int?", "CPUs of the learner's node"),
    "ranks_on_learner_node": ("int", "ranks of the job on the learner's node"),
}

_TYPES = {"str": str, "int": int, "number": (int, float), "bool": bool, "list": list, "dict": dict}


def problems(metrics: dict, table: dict = COMMON) -> list[str]:
    """The keys of `table` (COMMON, or a layout's) that a metrics dict lacks or holds with another type."""
    out = []
    for key, (kind, _) in table.items():
        if key not in metrics:
            out.append(f"{key}: missing")
            continue
        v, base = metrics[key], kind.rstrip("?")
        if v is None and kind.endswith("?"):
            continue
        if not isinstance(v, _TYPES[base]) or (base in ("int", "number") and isinstance(v, bool)):
            out.append(f"{key}: expected {kind}, got {v!r}")
    return out


def make_doc(table: dict = COMMON) -> str:
    """docs/outputs.md's list of the keys."""
    return "; ".join(f"`{k}` ({meaning})" for k, (_, meaning) in table.items())
