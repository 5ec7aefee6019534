"""`python -m mpippo.evaluate --checkpoint PATH`: how well does a trained agent play?

Runs the policy of a checkpoint (a policy: sampled, or --deterministic argmax; Q-values: greedy) for a
fixed number of episodes and prints mean, std, median, min and max return and episode length,
as a table and optionally as JSON. `--levels test` plays unseen levels (procgen num_levels=0,
level seeds after the training set) to measure the generalization gap of a run trained on a
limited set of levels; `--video FILE.mp4` records the first env's episodes (H.264, plays in a
browser). Under mpirun the episodes are split over the ranks and gathered on rank 0.
Connect Four checkpoints (self-play included) play `--opponent random|lookahead` and also
report wins, draws and losses.

Each env slot plays a fixed quota of episodes, so short episodes are not over-represented
(taking the first N episodes to finish from a batch would favour them).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from mpippo import config as C
from mpippo import faults, leftovers, preemption, runctl
from mpippo.algos import registry
from mpippo.checkpoint import (LATEST, PERIODIC, checkpoint_size, latest_missing, latest_path, load_checkpoint,
                               periodic_checkpoints, read_checkpoint_bytes, reading_problem)
from mpippo.files import absolute, atomic_write_json, file_mode, path_text
from mpippo.metrics.timers import Stopwatch
from mpippo import envs
from mpippo.envs import make_env, rank_seed
from mpippo.preemption import EXIT_STOPPED, EXIT_USAGE
from mpippo.usage import Parser, reason, refusal
from mpippo import toolcli
from mpippo.toolcli import output_file
from mpippo.errors import EnvFailure, os_reason, say_last

VIDEO_SCALE = 4  # 64x64 frames -> 256x256 (nearest neighbour), a size every H.264 decoder takes


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m mpippo.evaluate", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a checkpoint file, or a run folder (uses checkpoints/latest.pt)")
    p.add_argument("--num-episodes", type=int, default=100)
    p.add_argument("--deterministic", action="store_true",
                   help="a policy's argmax action instead of sampling (Q-values: always)")
    p.add_argument("--levels", choices=("train", "test"), default="train",
                   help="train: the run's own levels; test: unseen levels (num_levels=0)")
    p.add_argument("--num-envs", type=int, default=16, help="envs per rank played in parallel")
    p.add_argument("--seed", type=int, default=12345, help="0 to 2**63 - 1")
    p.add_argument("--video", type=Path, help="record the first env's episodes to this .mp4")
    p.add_argument("--video-episodes", type=int, default=3, help="episodes in the video")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--import", dest="imports", metavar="MODULE", default=None,
                   help="the checkpoint's env.import (the user's env module): a checkpoint imports nothing unless "
                        "this names it")
    p.add_argument("--opponent", choices=("random", "lookahead"), default=None,
                   help="two-player games: the heuristic player to face (default random; lookahead: Connect "
                        "Four's rules only)")
    p.add_argument("--max-steps", type=int, default=100_000, help="per env; a guard against policies that never finish")
    return p


def _why_not_there(path: Path) -> str:
    """What to give instead of a checkpoint that is not there: a periodic one the run pruned since (its
    checkpoint.keep_last) is named as such, with the oldest it keeps."""
    asked = PERIODIC.fullmatch(path.name)
    run = path.parent.parent
    if path.name == LATEST and (agents := sorted(a.name for a in run.glob("agent_*") if latest_path(a).is_file())):
        return f"a multi-agent run: each agent has its own, give one of its folders ({', '.join(agents)})"
    if path.name == LATEST and (newest := latest_missing(path.parent)):
        return f"{newest}; or give that file"
    kept = periodic_checkpoints(path.parent) if asked and path.parent.is_dir() else []
    if not kept:
        return "give a .pt file or a run folder"
    these = kept[0].name if len(kept) == 1 else f"{kept[0].name} to {kept[-1].name}"
    if int(asked[1]) < int(PERIODIC.fullmatch(kept[0].name)[1]):
        return (f"pruned: the run keeps only its newest periodic checkpoints (checkpoint.keep_last), {these}; or "
                f"give the run folder for its latest")
    return f"its periodic checkpoints are {these}; or give the run folder for its latest"


def resolve_checkpoint(path: str) -> Path:
    p = absolute(Path(path), "--checkpoint")
    try:
        return latest_path(p) if p.is_dir() else p
    except OSError as e:  # (a name too long, a loop of links: is_dir raises them, and only them)
        raise C.UsageError(f"--checkpoint: cannot read '{C.show(str(p))[1:-1]}' ({os_reason(e)})") from None


def build_policy(state: dict):
    """The checkpoint's network (its algorithm's, models.build), ready to act."""
    errors: list[str] = []
    cfg = C.from_dict(state["config"], errors)  # (checked by ckpt_schema when the checkpoint was read)
    spec = state["model_spec"]
    net = registry.get(state["algo"]).build_network(cfg, spec["obs_shape"], spec["num_actions"],
                                                    continuous=bool(spec.get("continuous", False)))
    try:
        net.load_state_dict(state["model"])
    except RuntimeError as e:
        raise C.UsageError(f"--checkpoint: model state does not fit its own spec ({str(e).splitlines()[0][:120]})") from None
    net.eval()
    return net


def greedy(algo: str, deterministic: bool) -> bool:
    """Whether evaluation takes the argmax: always for Q-values (the entry's greedy_eval), else with
    --deterministic (a policy samples from its logits)."""
    return deterministic or registry.get(algo).greedy_eval


def make_actor(net, algo: str, deterministic: bool, generator, obs_rms: dict | None = None, obs_clip: float = 10.0):
    """The policy as a function of a batch of observations; obs_rms: the run's observation
    normalization (training.normalize_obs), applied as in training."""
    import torch
    from mpippo.algos.buffers import ObsNormalizer  # torch: loaded once the checkpoint and options are checked
    q_values, argmax = registry.get(algo).network == "q", greedy(algo, deterministic)
    norm = None
    if obs_rms is not None:
        norm = ObsNormalizer(len(obs_rms["mean"]), obs_clip)
        norm.load_state_dict(obs_rms)

    @torch.inference_mode()
    def act(obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        out = net(torch.from_numpy(obs if norm is None else norm(obs)))
        if getattr(net, "continuous", False):  # the Gaussian's mean, or a draw (the env clips it)
            mean = out[0].float()
            if argmax:
                return mean.numpy()
            noise = torch.randn(mean.shape, generator=generator)
            return (mean + net.logstd.float().exp() * noise).numpy()
        scores = out if q_values else out[0]  # Q-values, or (logits, value)
        if mask is not None:  # legal actions only (two-player games)
            scores = scores.masked_fill(~torch.from_numpy(mask), float("-inf"))
        logits = scores
        if argmax:
            return logits.argmax(1).numpy()
        return torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator).squeeze(1).numpy()
    return act


ENV_KEYS = {C.file_key("env", f.name) for f in dataclasses.fields(C.EnvConfig)}


def env_config(state: dict) -> C.Config:
    """The run's env settings (its family moves them to held-out levels for --levels test)."""
    env = state["config"]["env"]
    errors: list[str] = []  # only the env and guards sections matter here; the run checked them when it started
    return C.from_dict({"env": {k: v for k, v in env.items() if k in ENV_KEYS},  # (a value a hand-edited file
                        "guards": state["config"].get("guards")}, errors)         # spoiled: its default)


PICTURE = "(H, W, 3) uint8 pictures of one size"  # what a video records: every frame as the first


def frame_problem(frame, first: tuple | None = None) -> str | None:
    """What makes `frame` no picture a video records, or None: an (H, W, 3) uint8 array, of the
    first frame's shape once there is one (an env's later frames are checked as its first is)."""
    if not isinstance(frame, np.ndarray):
        return f"is {type(frame).__name__}, not an array"
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        return f"is {frame.dtype} of shape {frame.shape}, not (H, W, 3) uint8"
    if first is not None and frame.shape != first:
        return f"is of shape {frame.shape}, the first was {first}"
    return None


def check_render(cfg: C.Config) -> None:
    """--video of an env whose observations are no pictures: it must render one (Gymnasium's
    rgb_array), tried once here, before any episode."""
    env = None
    try:
        env = make_env(cfg, 1, seed=0, render=True)
        frame = envs.family(cfg).picture(env.render() if hasattr(env, "render") else env.observe()[1][0])
        if (problem := frame_problem(frame)) is not None:
            raise ValueError(f"its frame {problem}")
    except C.UsageError:
        raise
    except EnvFailure as e:  # the user's env said what failed and where, in one line
        raise C.UsageError(f"--video: {e}") from None
    except Exception as e:  # noqa: BLE001 (an env's renderer may raise anything: a missing package, a display)
        raise C.UsageError(f"--video: {cfg.env.name} cannot render a picture ({reason(e, 160)})") from None
    finally:
        if env is not None:
            env.close()


def check_env(cfg: C.Config, state: dict, imports: str | None) -> None:
    """The checkpoint's env can be made here: its user module imported only when --import names it
    (a checkpoint alone never imports), its spaces those the network was trained on."""
    fam = envs.family(cfg)
    if cfg.env.imports is not None and imports != cfg.env.imports:
        raise C.UsageError(f"--import: the checkpoint's env {cfg.env.name} comes from the module "
                           f"'{cfg.env.imports}' (env.import), which runs code: name it to allow it, "
                           f"--import {cfg.env.imports}" + (f" (got '{imports}')" if imports else ""))
    if imports is not None and cfg.env.imports is None:
        raise C.UsageError(f"--import: '{C.show(imports)[1:-1]}' is not this checkpoint's env.import (it has none)")
    errors = fam.check(cfg)
    if errors:
        raise C.UsageError(errors[0])
    sp, spec = fam.spaces(cfg), state["model_spec"]
    if (list(sp.obs_shape) != list(spec["obs_shape"]) or sp.num_actions != spec["num_actions"]
            or sp.continuous != bool(spec.get("continuous", False))):
        raise C.UsageError(f"--checkpoint: {cfg.env.name} here has observations {list(sp.obs_shape)} and "
                           f"{sp.num_actions} actions, the network was trained on {list(spec['obs_shape'])} and "
                           f"{spec['num_actions']}")


def play(env, act, quota: np.ndarray, max_steps: int, video: Video | None, video_episodes: int, timer: Stopwatch):
    """Step until every env slot finished its quota; returns (returns, lengths, start frames) of counted
    episodes (start frames: Atari's, the frame each game began at; else empty). `timer` times the
    steps for the hang watch (runctl.watch_alone)."""
    n = env.num_envs
    done_count = np.zeros(n, dtype=np.int64)
    ep_ret, ep_len = np.zeros(n), np.zeros(n, dtype=np.int64)
    returns, lengths, starts = [], [], []
    start_frames = getattr(env, "episode_start_frames", None)  # Atari's
    _, obs, _ = env.observe()
    for _ in range(max_steps):
        if (done_count >= quota).all():
            break
        if video is not None and done_count[0] < min(quota[0], video_episodes):
            video.append(env.render() if hasattr(env, "render") else obs[0])
        with timer("inference"):
            actions = act(obs, env.action_mask() if hasattr(env, "action_mask") else None)
        with timer("env_step"):
            env.act(actions)
            rew, obs, first = env.observe()
        ep_ret += rew
        ep_len += 1
        ended = envs.ended_episodes(env, first, ep_ret, ep_len)
        began = start_frames() if start_frames is not None else None
        for k, (i, ret, length) in enumerate(zip(*ended)):
            if done_count[i] < quota[i]:
                returns.append(float(ret))
                lengths.append(int(length))
                if began is not None:
                    starts.append(int(began[k]))
            done_count[i] += 1
        ep_ret[first], ep_len[first] = 0.0, 0
    return returns, lengths, starts


class Video:
    """--video: the first env's frames, encoded as they come (kept until the end, 100 Atari games of up
    to 27,000 frames were tens of GB) into a temporary file of its own beside the video, which takes the
    video's name at the end (two evaluations of one --video never share it, a link planted there is
    never written through; it ends in .mp4, which ffmpeg reads the format from). A
    failure to encode (the disk, ffmpeg, a frame of another size) ends the recording, not the
    evaluation: `finish` says why, after the results are printed."""

    def __init__(self, path: Path, picture=None, fps: int = 15, scale: int | None = None):
        """picture: an observation -> the RGB picture recorded (the env family's: a board drawn)."""
        self.path, self.picture, self.fps, self.scale = path, picture or (lambda frame: frame), fps, scale
        self.frames, self.error, self._writer, self._tmp = 0, None, None, None
        self.first, self.bad_frame = None, False  # the first frame's shape; whether a frame was refused

    def append(self, frame: np.ndarray) -> None:
        if self.error is not None:
            return
        with toolcli.stops_held():  # a stop lands between frames: the file and its encoder made whole
            try:
                frame = self.picture(frame)
                if (problem := frame_problem(frame, self.first)) is not None:  # (the env's, not the encoder's)
                    self.error, self.bad_frame = f"the env's frame {self.frames + 1:,} {problem}", True
                    return self.discard()
                if self._writer is None:
                    self.first = frame.shape
                    self._open(frame)
                s = self.scale
                self._writer.append_data(np.repeat(np.repeat(frame, s, axis=0), s, axis=1) if s > 1 else frame)
                self.frames += 1
            except Exception as e:  # noqa: BLE001 (imageio and ffmpeg raise OSError, ValueError, RuntimeError)
                self.error = reason(e)
                self.discard()

    def _open(self, first: np.ndarray) -> None:
        import imageio.v2 as imageio
        if self.scale is None:  # a 64x64 observation is scaled up; a rendered picture is not
            self.scale = VIDEO_SCALE if first.shape[0] < 128 else 1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # named after this process (leftovers.owned_prefix): one that kill -9 left is removed by the next video here
        leftovers.sweep_leftovers((str(self.path.parent),))
        fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=leftovers.owned_prefix("video"), suffix=self.path.suffix)
        os.close(fd)
        self._tmp = Path(name)
        os.chmod(self._tmp, file_mode())  # as any file of the user's (mkstemp makes 0600)
        self._writer = imageio.get_writer(self._tmp, fps=self.fps, codec="libx264", pixelformat="yuv420p",
                                          macro_block_size=16, ffmpeg_log_level="error")

    def finish(self) -> str | None:
        """The video under its name; None, or why there is none (no temporary file is left either way)."""
        if self.error is None and self._writer is None:
            self.error = "no frame was recorded"
        if self.error is None:
            try:
                self._writer.close()
                self._writer = None
                self._tmp.replace(self.path)
            except Exception as e:  # noqa: BLE001 (as in append)
                self.error = reason(e)
        self.discard()
        return self.error

    def forget(self) -> None:
        """Remove the temporary file only (the process is about to end: its encoder goes with it)."""
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)

    def discard(self) -> None:
        """Close the encoder and remove the temporary file (the video, once named, stays)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                writer.close()
            except Exception:  # noqa: BLE001 (already failing: the first error is the one to report)
                pass
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def by_start_parity(returns: list, starts: list) -> dict | None:
    """Atari: the games' returns by the parity of the frame each began at (its no-op start). A policy
    that wins one parity and loses the other plays by rote, which deterministic ALE games allow
    (docs/envs.md); None without start frames."""
    if not starts:
        return None
    r, odd = np.asarray(returns, dtype=np.float64), np.asarray(starts) % 2 == 1
    return {name: {"episodes": int(part.sum()), "return_mean": float(r[part].mean()) if part.any() else None}
            for name, part in (("odd", odd), ("even", ~odd))}


def summarize(returns: list, lengths: list) -> dict:
    r, ln = np.asarray(returns, dtype=np.float64), np.asarray(lengths, dtype=np.float64)
    return {"episodes": len(r), "return_mean": float(r.mean()), "return_std": float(r.std()),
            "return_median": float(np.median(r)), "return_min": float(r.min()), "return_max": float(r.max()),
            "length_mean": float(ln.mean()), "length_median": float(np.median(ln))}


# (flag, lowest, highest): counts bounded by what one evaluation can hold in memory and finish
# (--num-envs is bounded by memory, below; --video-episodes by what a person watches)
RANGES = (("--num-episodes", 1, 1_000_000), ("--num-envs", 1, C.INT64_MAX), ("--max-steps", 1, 100_000_000),
          ("--video-episodes", 1, 100), ("--seed", 0, C.INT64_MAX))


def check_options(args) -> None:
    """Every option, before the checkpoint is read or an env made (one UsageError line)."""
    if faults.ERROR:
        raise C.UsageError(faults.ERROR)
    for flag, lo, hi in RANGES:
        value = getattr(args, flag[2:].replace("-", "_"))
        allowed = f"allowed: {lo:,} to {'2**63 - 1' if hi == C.INT64_MAX else f'{hi:,}'}"
        if value < lo:
            raise C.UsageError(f"{flag}: must be >= {lo}, got {C.show(value)}; {allowed}")
        if value > hi:
            raise C.UsageError(f"{flag}: must be <= {hi:,}, got {C.show(value)}; {allowed}")
    if args.video is not None and args.video.suffix.lower() != ".mp4":
        raise C.UsageError(f"--video: '{C.show(str(args.video))[1:-1]}' must end in .mp4")
    args.json, args.video = (absolute(p, flag) for p, flag in ((args.json, "--json"), (args.video, "--video")))
    toolcli.distinct_outputs((args.json, "--json"), (args.video, "--video"))


def check_not_input(path: Path | None, flag: str, checkpoint: Path) -> None:
    """An output may not replace the checkpoint it evaluates (a .pt anywhere), nor what any run folder holds
    (toolcli.not_a_runs_own: before the checkpoint is read)."""
    if path is None:
        return
    if toolcli.real(path) == toolcli.real(checkpoint):
        raise C.UsageError(f"{flag}: '{C.show(str(path))[1:-1]}' is one of the run's own files (the checkpoint); "
                            f"give another name")
    toolcli.not_a_runs_own(path, flag)


def memory_problem(state: dict, num_envs: int) -> str | None:
    """The envs' frames and the network's first activations for one batch, against this node."""
    cfg = state["config"]
    obs = tuple(state["model_spec"]["obs_shape"])
    if len(obs) == 3:  # uint8 frames, the first conv's float32 output
        per_env = int(np.prod(obs)) * 2 + obs[0] * obs[1] * cfg["model"]["channels"][0] * 4
    else:  # float32 vectors, both MLPs' activations
        per_env = int(np.prod(obs)) * 8 + 2 * sum(cfg["model"].get("mlp_sizes") or C.ModelConfig().mlp_sizes) * 4
    need, have = num_envs * per_env, C.memory_available(1)
    if need <= have:
        return None
    return (f"--num-envs: {num_envs:,} envs need at least {need / 2**30:,.1f} GiB, {have / 2**30:,.1f} GiB are "
            f"available; lower it")


def _checkpoint_fits(args, world) -> Path:
    """The checkpoint rank 0 found (its outputs checked first: none may replace it), and its size against
    the memory of each rank's node, for the copies that node's ranks will hold."""
    path, size = runctl.on_root(world, lambda: _find_checkpoint(args))
    if (problem := reading_problem(path, size, world.local_size)):
        raise C.UsageError(problem)
    return path


def load_and_check(args, world, start: "_StartUp", path: Path) -> tuple[Path, dict, object, C.Config, list[str], bool]:
    """Checkpoint, network, env settings and outputs (the options checked before), all before any episode."""
    # rank 0 reads the checkpoint for every rank: each rank's own read could meet another latest.pt (a live
    # run replaces it), and ranks on other nodes need not see the file at all
    data = runctl.on_root(world, lambda: read_checkpoint_bytes(path, world.local_size))
    import mpippo.algos.implementations  # noqa: F401  (torch and the algorithms: what the checkpoint needs)
    runctl.freeze_imports()
    state = load_checkpoint(data, str(path))
    if (problem := memory_problem(state, args.num_envs)):
        raise C.UsageError(problem)
    net = build_policy(state)
    cfg = env_config(state)
    start.hang_s = runctl.startup_timeout(cfg.guards.collective_timeout_s)  # (the env's code runs from here)
    check_env(cfg, state, args.imports)
    notes = envs.family(cfg).held_out(cfg) if args.levels == "test" else []
    if args.video is not None:
        check_render(cfg)
    two_player = envs.family(cfg).two_player
    if args.opponent is not None and not two_player:
        raise C.UsageError(f"--opponent: '{args.opponent}' needs a two-player game; this checkpoint's env is "
                            f"'{cfg.env.name}' (allowed: {', '.join(f.name for f in envs.FAMILIES if f.two_player)})")
    if args.opponent is not None and args.opponent not in (players := envs.family(cfg).heuristics(cfg.env.name)):
        raise C.UsageError(f"--opponent: '{cfg.env.name}' has no {args.opponent} player; allowed: {', '.join(players)}")
    for path_, flag in ((args.json, "--json"), (args.video, "--video")):
        if world.is_root and path_ is not None:  # only rank 0 writes; a path it cannot write is refused now, not
            output_file(path_, flag)             # after the whole evaluation
    return path, state, net, cfg, notes, two_player


def _find_checkpoint(args) -> tuple[Path, int]:
    """The checkpoint's path and size, its outputs checked first: no output may replace what it reads."""
    path = resolve_checkpoint(args.checkpoint)
    check_not_input(args.json, "--json", path)
    check_not_input(args.video, "--video", path)
    try:
        if not path.is_file():
            raise C.UsageError(f"--checkpoint: no checkpoint at '{path}' ({_why_not_there(path)})")
    except OSError as e:
        raise C.UsageError(f"--checkpoint: cannot read '{C.show(str(path))[1:-1]}' ({os_reason(e)})") from None
    return path, checkpoint_size(path)


class _StartUp:
    """evaluate's start-up as its watch sees it (_startup_watched): how long the user's code may hold it
    (the default config's watchdog until the run's config is read), and the video to leave nothing of."""

    def __init__(self):
        self.hang_s = runctl.startup_timeout(C.GuardsConfig().collective_timeout_s)
        self.video: Video | None = None


def main(argv: list[str] | None = None) -> int:
    from mpippo.comm import World  # MPI's bindings: loaded by the command, not by `import mpippo.evaluate`
    world = World()
    world.install_abort_hook()
    start = _StartUp()
    with _startup_watched(world, start):
        begun = _start(argv, world, start)
    if isinstance(begun, int):
        return begun
    args, (path, state, net, cfg, notes, two_player), env, quota, video = begun
    import torch
    toolcli.reclaim_stops()  # the envs' code ran (a user's env may set its own handlers): a stop is still one line
    if two_player and args.opponent not in (None, "random"):
        env.set_opponent(envs.family(cfg).heuristic(cfg.env.name, args.opponent,
                                                    np.random.default_rng(rank_seed(args.seed, world.rank) + 1)))
    act = make_actor(net, state["algo"], args.deterministic, torch.Generator().manual_seed(args.seed + world.rank),
                     state.get("obs_rms"), state["config"]["training"].get("obs_clip", 10.0))
    runctl.end_startup_gc_pause()
    try:
        return _play_and_report(args, world, (path, state, cfg, notes, two_player), env, act, quota, video)
    finally:  # however it ends (a stop signal above all): no half-written video is left
        if video is not None:
            video.discard()


def _start(argv: list[str] | None, world, start: _StartUp):
    """The checks, then the envs: an exit code (a refusal, agreed by every rank; --help), or what the
    episodes need."""
    error = None
    try:  # the options first, agreed: a rank that refused them must not meet rank 0 in its checkpoint's bcast
        args = make_parser().parse_args(argv)
        check_options(args)
    except C.UsageError as e:
        error = e.errors[0]
    except SystemExit as e:  # --help
        return int(e.code or 0)
    if _refused(world, error):
        return EXIT_USAGE
    try:  # agreed before rank 0's bcast of its bytes: a node short of memory refuses, never meets the bcast
        path = _checkpoint_fits(args, world)
    except C.UsageError as e:
        error = e.errors[0]
    if _refused(world, error):
        return EXIT_USAGE
    try:
        path, state, net, cfg, notes, two_player = load_and_check(args, world, start, path)
    except C.UsageError as e:
        error = e.errors[0]
    if _refused(world, error):
        return EXIT_USAGE
    import torch  # after the checks: a bad option or file is refused without loading torch
    torch.set_num_threads(1)
    # episodes split over ranks, then over env slots: the counts add up to --num-episodes exactly
    mine = args.num_episodes // world.size + (world.rank < args.num_episodes % world.size)
    n_envs = max(1, min(args.num_envs, mine)) if mine else 1
    quota = np.array([mine // n_envs + (i < mine % n_envs) for i in range(n_envs)], dtype=np.int64)
    video = start.video = Video(args.video, envs.family(cfg).picture) if (args.video is not None and world.is_root) else None
    env = error = None
    try:  # (a user's env meets its own spaces first here: one line, agreed)
        env = make_env(cfg, n_envs, seed=rank_seed(args.seed, world.rank), render=video is not None)
    except C.UsageError as e:
        error = e.errors[0]
    if _refused(world, error):
        return EXIT_USAGE
    return args, (path, state, net, cfg, notes, two_player), env, quota, video


def _startup_watched(world, start: _StartUp):
    """Start-up runs the user's code (its env made to check its spaces, then its envs), which may never
    return where no signal reaches Python (a constructor waiting in native code on its simulator): the
    trainer's start-up watch (runctl.watch_startup) ends it STOP_GRACE_S after a stop, or once held
    past start-up's watchdog. On every rank: evaluate's ranks wait for each other without a collective
    timeout, and one rank's abort ends them all."""
    who = f"rank {world.rank}: " if world.size > 1 else ""

    def ended(code: int, line: Callable[[str], str]) -> None:  # from the watch's thread, the main thread held
        if start.video is not None:
            start.video.forget()
        runctl.end_held(world, code, line)
    return toolcli.watch_startup("evaluate", who, lambda: start.hang_s, ended)


def _play_and_report(args, world, checked: tuple, env, act, quota: np.ndarray, video: Video | None) -> int:
    """The episodes, gathered on rank 0, and its table, JSON and video."""
    path, state, cfg, notes, two_player = checked
    t0, timer = time.perf_counter(), Stopwatch(("env_step", "inference"))
    def end(code: int) -> None:  # a hung rank: no half-made video left behind
        if video is not None:
            video.forget()
        world.abort(code)

    def stopped(sig: int) -> None:  # a stop its env's native code kept the main thread from raising
        if world.is_root:
            say_last(toolcli.stopped_line("evaluate", sig))
        end(EXIT_STOPPED)
    with runctl.watch_alone(timer, cfg.guards.collective_timeout_s, end, what="the evaluation", kept="",
                            who=f"rank {world.rank}: " if world.size > 1 else "",
                            stop_due=preemption.unheard(toolcli.first_stop), stop_end=stopped):
        played = play(env, act, quota, args.max_steps, video, args.video_episodes, timer) if quota.sum() else ([], [], [])
    env.close()
    gathered = world.gather_obj(played)
    if not world.is_root:
        return 0
    returns, lengths, starts = ([x for part in gathered for x in part[k]] for k in range(3))
    if len(returns) < args.num_episodes:
        sys.stderr.write(f"mpippo: error: only {len(returns)} of {args.num_episodes} episodes ended within "
                         f"--max-steps {args.max_steps} per env; raise it to the episodes per env ({int(quota.max())}) x "
                         f"the longest episode (an Atari game: up to 27,000 steps), or --num-envs\n")
        return 1
    res = {"checkpoint": path_text(path), "algo": state["algo"], "env": cfg.env.name,
           "distribution_mode": cfg.env.distribution_mode, "levels": args.levels,
           "num_levels": cfg.env.num_levels, "start_level": cfg.env.start_level,
           "deterministic": greedy(state["algo"], args.deterministic),
           "trained_timesteps": int(state["timesteps"]), "ranks": world.size,
           **summarize(returns, lengths), "seconds": time.perf_counter() - t0, "notes": notes}
    if (phases := by_start_parity(returns, starts)) is not None:
        res["by_start_parity"] = phases
    if "num_levels" not in envs.family(cfg).keys:  # an env without levels (gym:<id>): none to report
        res.update(distribution_mode=None, levels=None, num_levels=None, start_level=None)
    if two_player:  # +1 win, 0 draw, -1 loss
        r = np.asarray(returns)
        res.update(opponent=args.opponent or "random", wins=int((r > 0).sum()), draws=int((r == 0).sum()),
                   losses=int((r < 0).sum()), win_rate=float((r > 0).mean()))
    return write_outputs(args, res, video)


def write_outputs(args, res: dict, video: Video | None) -> int:
    """Video, table, JSON. The table is printed before the JSON is written and a video that failed
    stops nothing, so a file system that fails now (the paths were probed before the first episode)
    loses no result."""
    failed = video.finish() if video is not None else None
    if video is not None and failed is None:
        res["video"], res["video_frames"] = path_text(args.video), video.frames
    print_table(res)
    code = 0
    if args.json is not None:
        try:
            atomic_write_json(args.json, res)
            print(f"  json          {args.json}")
        except OSError as e:
            sys.stderr.write(refusal([f"--json: writing '{args.json}' failed ({os_reason(e)})"]))
            code = 1
    if failed is not None and video.bad_frame:  # the env broke its pictures: its user's to mend
        sys.stderr.write(refusal([f"--video: {failed}; allowed: {PICTURE}; no video written"]))
        code = 2
    elif failed is not None:
        sys.stderr.write(refusal([f"--video: writing '{args.video}' failed ({failed})"]))
        code = 1
    return code


def _refused(world, error: str | None) -> bool:
    """Every rank's verdict gathered: the first refusal is the job's one line (rank 0 writes it)."""
    errors = world.allgather_obj(error)
    if any(errors) and world.is_root:
        sys.stderr.write(refusal([next(e for e in errors if e)]))
    return any(errors)


def print_table(res: dict) -> None:
    levels = "unseen levels" if res["levels"] == "test" else (
        f"training levels ({res['num_levels']} from {res['start_level']})" if res["num_levels"] else "training levels (all)")
    if "wins" in res:  # a board game: no levels
        levels = f"against the {res['opponent']} player"
    mode = f" ({res['distribution_mode']})" if res["distribution_mode"] and "wins" not in res else ""
    levels = "" if res["levels"] is None and "wins" not in res else f"{levels}, "
    print(f"mpippo evaluate: {res['algo']} on {res['env']}{mode}, {levels}"
          f"{'greedy' if res['deterministic'] else 'sampled'} actions, trained {res['trained_timesteps']:,} steps")
    rows = [("episodes", f"{res['episodes']} over {res['ranks']} rank(s) in {res['seconds']:.1f} s"),
            ("return", f"{res['return_mean']:.2f} +- {res['return_std']:.2f} (median {res['return_median']:.2f}, "
                       f"min {res['return_min']:.2f}, max {res['return_max']:.2f})"),
            ("length", f"{res['length_mean']:.1f} (median {res['length_median']:.0f})")]
    if "wins" in res:
        rows.append((f"vs {res['opponent']}", f"{res['wins']} wins, {res['draws']} draws, {res['losses']} losses "
                                              f"(win rate {res['win_rate']:.2f})"))
    if "by_start_parity" in res:  # Atari: a policy that wins one frame phase only plays by rote
        rows.append(("start frame", ", ".join(
            f"{name} {p['episodes']} game(s) {'-' if p['return_mean'] is None else format(p['return_mean'], '.2f')}"
            for name, p in res["by_start_parity"].items())))
    if "video" in res:
        rows.append(("video", f"{res['video']} ({res['video_frames']} frames)"))
    for k, v in rows:
        print(f"  {k:<13} {v}")
    for note in res["notes"]:
        print(f"  note: {note}")
    sys.stdout.flush()


if __name__ == "__main__":
    import gc

    from mpippo.errors import let_readers_leave
    gc.disable()  # for start-up (torch's import); on again once the evaluator is built (runctl.end_startup_gc_pause)
    let_readers_leave()  # first: a descriptor the process started without is /dev/null before the log's pipe
    preemption.log_signals()  # (the hang watch reads them: a main thread in native code may never)
    toolcli.exit_process(toolcli.run("evaluate", main))  # a stop signal: one line, exit 4, nothing half-written
