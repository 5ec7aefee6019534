"""Hostile inputs to the env registry (mpippo/envs/): Gymnasium ids, env.kwargs, env.import and
the spaces of a user's env, at the trainer, on resume and at evaluate. The same promise as every
table (hostile.check): exit 2, one line naming the bad value and what is allowed, no traceback,
nothing written before changed, nothing left behind; and a user's module is imported only when
the command line or the config names it (a run folder or a checkpoint alone never imports)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import hostile
from conftest import ROOT, ok, run
from hostile import Case

USER_ENVS = str(ROOT / "tests" / "user_env")
CARTPOLE = ["--config", "configs/ppo_cartpole.yaml", "--no-progress", "--total-timesteps", "512"]
ATARI = ["--config", "configs/ppo_atari.yaml", "--no-progress", "--total-timesteps", "512", "--set", "env.name=atari:Pong"]
NIM = ["--config", "configs/ppo_cartpole.yaml", "--no-progress", "--total-timesteps", "2048",
       "--set", "env.name=pz:nim", "--set", "env.import=mpippo_user_envs:make_nim"]  # the user's own two-player game
USER = ["--config", "configs/ppo_cartpole.yaml", "--no-progress", "--total-timesteps", "512",
        "--set", "env.import=mpippo_user_envs"]


def train(*args, ranks=None, files: dict | None = None, path: str = USER_ENVS, env: dict | None = None):
    """A trainer case with `path` on PYTHONPATH (the user's env module) and `env`'s variables, files
    written first and TMP/ standing for the case folder."""
    def setup(tmp, shared):
        for name, data in (files or {}).items():
            (tmp / name).write_text(data)
        argv = [a.replace("TMP/", f"{tmp}/") for a in args]
        if "--output-dir" not in argv and "--resume" not in argv:
            argv += ["--output-dir", f"{tmp}/out"]
        return ranks, ["run_mpi.py", *argv], {"PYTHONPATH": path.replace("TMP/", f"{tmp}/"), **(env or {})}
    return setup


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    """One short run of the user's env (env.import), for the resume and evaluate cases."""
    folder = tmp_path_factory.mktemp("user-run") / "run"
    ok(run([sys.executable, "run_mpi.py", *USER, "--set", "env.name=gym:mpippo-test/Target-v0", "--set",
            "training.normalize_obs=true", "--output-dir", str(folder)], 180, env={"PYTHONPATH": USER_ENVS}))
    return {"run": folder}


def on_user_run(*argv, module: str = "run_mpi.py"):
    """argv on a copy of the user run (RUN): cases run two at a time, and a refused resume still takes
    the run's lock for a moment (its lock file's line, put back at exit), which the other case's
    before-and-after hashes of a shared folder would catch half-way."""
    def setup(tmp, shared):
        import shutil
        run_dir = tmp / "run"
        shutil.copytree(shared["run"], run_dir)
        args = [a.replace("RUN", str(run_dir)) for a in argv]
        return None, ([module] if module.endswith(".py") else ["-m", module]) + args, {"PYTHONPATH": USER_ENVS}
    return setup


def edited(edit, *argv):
    """--resume (env.import named) of a copy of the user run whose latest.pt went through edit(state)."""
    def setup(tmp, shared):
        import shutil

        import torch
        run_dir = tmp / "run"
        shutil.copytree(shared["run"], run_dir)
        path = run_dir / "checkpoints" / "latest.pt"
        state = torch.load(path, weights_only=False)
        edit(state)
        torch.save(state, path)
        return None, ["run_mpi.py", "--resume", "--no-progress", "--output-dir", str(run_dir), "--set",
                      "env.import=mpippo_user_envs", *argv], {"PYTHONPATH": USER_ENVS}
    return setup


# a "billion laughs": 9 levels of 9 aliases, 387 million values from 300 bytes
BOMB_VALUE = "[&a [x, x, x, x, x, x, x, x, x], " + ", ".join(
    f"&{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")) + "]"
KWARGS_BOMB = f"env:\n  name: gym:CartPole-v1\n  kwargs:\n    a: {BOMB_VALUE}\n"


def set_(key, value):
    return ["--set", f"{key}={value}"]


CASES = [
    Case("gym-unknown-id", train(*CARTPOLE, *set_("env.name", "gym:CartPol-v1"), ranks=2),
         "'CartPol-v1' is not a registered Gymnasium id (did you mean 'gym:CartPole-v1'?)"),
    Case("gym-ale-id", train(*CARTPOLE, *set_("env.name", "gym:ALE/Pong-v5")),
         "'ALE/Pong-v5' is not a registered Gymnasium id (Atari games are atari:<Game>: did you mean 'atari:Pong'?)"),
    Case("gym-id-out-of-date", train(*CARTPOLE, *set_("env.name", "gym:HalfCheetah-v3")),
         "making 'HalfCheetah-v3' with env.kwargs {} failed (ImportError: The mujoco v2 and v3 based environments have "
         "been moved to the gymnasium-robotics project"),
    # MuJoCo's import reads MUJOCO_GL (a cluster's profile may set it): a backend it cannot load
    Case("mujoco-gl-unknown", train("--config", "configs/ppo_mujoco.yaml", *set_("env.name", "gym:Hopper-v5"),
                                    "--total-timesteps", "4096", ranks=2, env={"MUJOCO_GL": "osmesa2"}),
         "MUJOCO_GL='osmesa2': MuJoCo's import failed with it for 'Hopper-v5' (RuntimeError: invalid value for "
         "environment variable MUJOCO_GL: osmesa2); allowed: unset"),
    Case("mujoco-gl-word", train("--config", "configs/ppo_mujoco.yaml", *set_("env.name", "gym:Walker2d-v5"),
                                 "--total-timesteps", "4096", env={"MUJOCO_GL": "opengl"}),
         "MUJOCO_GL='opengl': MuJoCo's import failed with it for 'Walker2d-v5'"),
    Case("gym-empty-id", train("--config", "TMP/c.yaml", "--no-progress", files={"c.yaml": 'env: {name: "gym:"}\n'}),
         "env.name: 'gym:' is not gym:<id> with a Gymnasium id"),
    Case("gym-module-in-id", train(*CARTPOLE, *set_("env.name", "gym:os:system")),
         "a module to import goes in env.import"),
    Case("gym-kwargs-not-mapping", train(*CARTPOLE, *set_("env.kwargs", "[1, 2]")), "env.kwargs: expected mapping"),
    Case("gym-kwargs-bad-key", train(*CARTPOLE, *set_("env.kwargs", "{1: 2}")), "env.kwargs: keys must be keyword"),
    Case("gym-kwargs-refused-by-env", train(*CARTPOLE, *set_("env.kwargs", "{bogus: 1}"), ranks=2),
         "making 'CartPole-v1' with env.kwargs {'bogus': 1} failed (TypeError"),
    # a value of another type than the constructor's default, which Python would take: 'maybe' is a true bool
    Case("gym-kwargs-type-bool", train(*CARTPOLE, *set_("env.kwargs.sutton_barto_reward", "maybe"), ranks=2),
         "env.kwargs.sutton_barto_reward: 'maybe' is not true or false, as CartPole-v1's default (False) is"),
    Case("gym-kwargs-type-int", train(*CARTPOLE, *set_("env.name", "gym:HalfCheetah-v5"),
                                      *set_("env.kwargs.frame_skip", "2.5")),
         "env.kwargs.frame_skip: 2.5 is not a whole number, as HalfCheetah-v5's default (5) is"),
    Case("gym-kwargs-reserved", train(*CARTPOLE, *set_("env.kwargs", "{render_mode: human}")),
         "env.kwargs.render_mode: set by mpippo"),
    Case("gym-kwargs-huge", train(*CARTPOLE, *set_("env.kwargs", "{a: " + "x" * 5000 + "}")),
         "env.kwargs: 5,0"),
    Case("gym-kwargs-nan", train("--config", "configs/ppo_mujoco.yaml", *set_("env.kwargs.ctrl_cost_weight", ".nan"),
                                 ranks=2),
         "env.kwargs.ctrl_cost_weight: nan holds a NaN, which no setting of an env means; allowed: values without NaN"),
    Case("pz-kwargs-nan-nested", train(*NIM, *set_("env.kwargs", "{stones: 5, extra: [1, .nan]}")),
         "env.kwargs.extra: [1, nan] holds a NaN"),
    Case("gym-kwargs-time-limit-negative", train(*CARTPOLE, *set_("env.kwargs.max_episode_steps", "-3")),
         "env.kwargs.max_episode_steps: -3 is not a whole number of steps; allowed: 1 or more"),
    Case("atari-kwargs-entry-misspelled", train(*CARTPOLE, *set_("env.name", "atari:Pong"),
                                                *set_("env.kwargs.nop_max", "5")),
         "env.kwargs.nop_max: not an option of atari envs; allowed: repeat_action_probability, full_action_space, noop_max"),
    Case("gym-kwargs-on-procgen", train(*CARTPOLE, *set_("env.name", "coinrun"), *set_("env.kwargs", "{a: 1}")),
         "env.kwargs: {'a': 1} is read by gymnasium, pettingzoo, atari envs only; env.name 'coinrun' is of the procgen "
         "family"),
    # Procgen's own keys on another family's env: they were kept in config.yaml and did nothing
    Case("procgen-mode-on-gym", train(*CARTPOLE, *set_("env.distribution_mode", "hard")),
         "env.distribution_mode: 'hard' is read by procgen envs only; env.name 'gym:CartPole-v1' is of the gymnasium "
         "family: remove it"),
    Case("procgen-levels-on-atari", train(*CARTPOLE, *set_("env.name", "atari:Pong"), *set_("env.num_levels", "200")),
         "env.num_levels: 200 is read by procgen envs only; env.name 'atari:Pong' is of the atari family: remove it"),
    Case("gym-kwargs-dotted-key", train(*CARTPOLE, *set_("env.kwargs.cfg.a", "1")),
         "env.kwargs: keys must be keyword names, got ['cfg.a'] (a nested value is given whole: "
         "--set env.kwargs.cfg={a: ...})"),
    Case("gym-import-missing", train(*CARTPOLE, *set_("env.import", "no_such_module_here")),
         "env.import: importing 'no_such_module_here' failed (ModuleNotFoundError"),
    Case("gym-import-raises", train(*CARTPOLE, *set_("env.import", "raising_module"), ranks=2,
                                    files={"raising_module.py": "raise RuntimeError('boom at import')\n"}, path="TMP/"),
         "env.import: importing 'raising_module' failed (RuntimeError: boom at import)"),
    # the user's code calling sys.exit at start-up: its code was the run's (0: nothing trained, in silence; 3: the
    # requeue's); on one rank of two the other waited forever
    Case("gym-import-exits-on-one-rank", train(*CARTPOLE, *set_("env.import", "exiting"), ranks=2, files={
        "exiting.py": "import os, sys\nif os.environ.get('OMPI_COMM_WORLD_RANK') == '1':\n    sys.exit(3)\n"},
        path="TMP/"), "env.import: importing 'exiting' failed (called sys.exit(3))"),
    Case("gym-import-exits-zero", train(*CARTPOLE, *set_("env.import", "exiting"), files={
        "exiting.py": "import sys\nsys.exit(0)\n"}, path="TMP/"), "importing 'exiting' failed (called sys.exit(0))"),
    Case("gym-user-env-exits-in-constructor", train(*USER, *set_("env.name", "gym:mpippo-test/Faulty-v0"),
                                                    *set_("env.kwargs", "{fault: exit-make, rank: 1}"), ranks=2),
         "making 'mpippo-test/Faulty-v0' with env.kwargs {'fault': 'exit-make', 'rank': 1} failed (called sys.exit(3))"),
    Case("gym-user-env-exits-in-reset", train(*USER, *set_("env.name", "gym:mpippo-test/Faulty-v0"),
                                              *set_("env.kwargs", "{fault: exit-reset}")),
         "resetting them failed (called sys.exit(0))"),
    Case("gym-user-env-nan-in-first-reset", train(*USER, *set_("env.name", "gym:mpippo-test/Faulty-v0"),
                                                  *set_("env.kwargs", "{fault: nan-reset}")),
         "returned an observation holding nan (as float32) from its reset(); allowed: finite values"),
    Case("gym-user-env-swaps-its-space-in-reset", train(*USER, *set_("env.name", "gym:mpippo-test/Faulty-v0"),
                                                       *set_("env.kwargs", "{fault: swap-space}")),
         "its observations of the shape of Box(-1.0, 1.0, (3,), float32) (as it declared them when made)"),
    Case("gym-user-env-observations-undeclared", train(*USER, *set_("env.name", "gym:mpippo-test/NoSpaces-v0")),
         "env.name: 'gym:mpippo-test/NoSpaces-v0': its spaces cannot be read (AttributeError"),
    Case("gym-import-not-a-module", train(*CARTPOLE, *set_("env.import", "os;rm")), "'os;rm' is not a module"),
    Case("gym-import-on-procgen", train(*CARTPOLE, *set_("env.name", "coinrun"), *set_("env.import", "json")),
         "env.import: 'json' is read by gymnasium, pettingzoo envs only"),
    Case("gym-entry-not-callable", train(*USER, *set_("env.name", "gym:Mine-v0"),
                                         *set_("env.import", "mpippo_user_envs:LIMIT")),
         "has no callable 'LIMIT'"),
    Case("gym-entry-clashes-with-an-id", train(*USER, *set_("env.import", "mpippo_user_envs:make_corridor")),
         "'CartPole-v1' is already a registered Gymnasium id"),
    Case("gym-multidiscrete-actions", train(*USER, *set_("env.name", "gym:mpippo-test/MultiAction-v0")),
         "the action space MultiDiscrete([2 3]) is not supported; allowed: Discrete, or Box of shape (A,)"),
    Case("gym-box-actions-with-images", train(*USER, *set_("env.name", "gym:mpippo-test/ImageBoxActions-v0")),
         "with image observations are not supported; allowed: Box actions with vector observations"),
    Case("gym-normalize-obs-on-images", train(*CARTPOLE, *set_("env.name", "coinrun"),
                                              *set_("training.normalize_obs", "true")),
         "training.normalize_obs: coinrun has image observations; allowed: true for vector observations only"),
    Case("gym-obs-clip-zero", train(*CARTPOLE, *set_("training.obs_clip", "0")), "training.obs_clip: must be > 0"),
    Case("gym-dict-observations", train(*USER, *set_("env.name", "gym:mpippo-test/DictObs-v0"), ranks=2),
         "the observation space Dict('a': Discrete(3)) is not supported; allowed: Box of shape (D,)"),
    Case("gym-float-image", train(*USER, *set_("env.name", "gym:mpippo-test/FloatImage-v0")),
         "is not uint8; allowed: uint8 images"),
    # trained as a 4-pixel-high picture of 84 channels, without a word, before
    Case("gym-channels-first-image", train(*USER, *set_("env.name", "gym:mpippo-test/ChannelsFirst-v0")),
         "Box(0, 255, (4, 84, 84), uint8) looks channels-first (C, H, W); allowed: channels-last images (H, W, C)"),
    Case("gym-channels-first-image-dqn", train("--config", "configs/dqn_cartpole.yaml", "--no-progress",
                                               "--total-timesteps", "512", "--set", "env.import=mpippo_user_envs",
                                               *set_("env.name", "gym:mpippo-test/ChannelsFirst-v0"), ranks=2),
         "looks channels-first (C, H, W)"),
    Case("gym-env-cannot-be-made", train(*USER, *set_("env.name", "gym:mpippo-test/Broken-v0")),
         "failed (ValueError: this env cannot be made)"),
    Case("gym-env-dependency-missing-with-kwargs", train(*USER, *set_("env.name", "gym:mpippo-test/MissingDep-v0"),
                                                         *set_("env.kwargs.size", "3")),
         "making 'mpippo-test/MissingDep-v0' with env.kwargs {'size': 3} failed (ModuleNotFoundError: No module named"),
    Case("gym-import-callable-malformed-id", train(*CARTPOLE, *set_("env.name", "gym:bad id"),
                                                   *set_("env.import", "json:loads")),
         "env.name: 'bad id' cannot name the env of env.import 'json:loads' (Malformed environment ID"),
    Case("gym-import-callable-id-two-slashes", train(*CARTPOLE, *set_("env.name", "gym:a/b/c"),
                                                     *set_("env.import", "json:loads")),
         "env.name: 'a/b/c' cannot name the env of env.import"),
    Case("gym-kwargs-yaml-bomb", train("--config", "TMP/c.yaml", "--no-progress", files={"c.yaml": KWARGS_BOMB}),
         "its anchors and aliases (&, *) expand to more than 100,000 values"),
    Case("atari-kwargs-yaml-bomb-set", train(*ATARI, *set_("env.kwargs.noop_max", BOMB_VALUE)),
         "--set env.kwargs.noop_max: its anchors and aliases (&, *) expand to more than 100,000 values"),
    Case("gym-user-env-reset-wrong-shape", train(*USER, *set_("env.name", "gym:mpippo-test/WrongShape-v0"), ranks=2),
         "'gym:mpippo-test/WrongShape-v0': making 2 and resetting them failed (ValueError"),
    Case("gym-user-env-spaces-differ", train(*USER, *set_("env.name", "gym:mpippo-test/Shifting-v0")),
         "'gym:mpippo-test/Shifting-v0': making 4 and resetting them failed (RuntimeError"),
    Case("gym-user-env-integer-box-actions", train(*USER, *set_("env.name", "gym:mpippo-test/IntegerBox-v0")),
         "env.name: the action space Box(0, 5, (2,), int64) holds int64 values; allowed: Discrete, or a Box of floats"),
    Case("gym-user-env-old-reset", train(*USER, *set_("env.name", "gym:mpippo-test/OldReset-v0")),
         "making 4 and resetting them failed (TypeError: its reset() returned ndarray"),
    Case("gym-kwargs-time-limit-bool", train(*CARTPOLE, *set_("env.kwargs.max_episode_steps", "yes")),
         "env.kwargs.max_episode_steps: True is not a whole number of steps; allowed: 1 or more"),
    Case("gym-kwargs-time-limit-zero", train(*CARTPOLE, *set_("env.kwargs", "{max_episode_steps: 0}")),
         "env.kwargs.max_episode_steps: 0 is not a whole number of steps; allowed: 1 or more"),
    Case("gym-kwargs-time-limit-float", train(*CARTPOLE, *set_("env.kwargs.max_episode_steps", "1e3")),
         "env.kwargs.max_episode_steps: 1000.0 is not a whole number of steps"),
    Case("gym-kwargs-key-twice", train(*CARTPOLE, *set_("env.kwargs", "{max_episode_steps: 9, max_episode_steps: 90}")),
         "--set env.kwargs: duplicate key 'max_episode_steps' (first given at line 1)"),
    Case("pz-unknown-game", train(*CARTPOLE, *set_("env.name", "pz:connect_four_v2")),
         "env.name: 'pz:connect_four_v2' is not one of PettingZoo's classic two-player games here (did you mean "
         "'pz:connect_four_v3'?); allowed: pz:connect_four_v3, pz:tictactoe_v3 (PettingZoo's classic two-player games), "
         "or pz:<name> with env.import module:callable"),
    Case("pz-kwargs", train(*CARTPOLE, *set_("env.name", "pz:connect_four_v3"), *set_("env.kwargs", "{a: 1}")),
         "env.kwargs: {'a': 1} is for your own game's constructor (env.import); 'pz:connect_four_v3' takes none"),
    Case("pz-user-game-three-players", train(*NIM, *set_("env.import", "mpippo_user_envs:make_three_player_game")),
         "env.name: 'pz:nim' has 3 agent(s) (first, second, third); allowed: two-player games"),
    Case("pz-user-game-box-actions", train(*NIM, *set_("env.import", "mpippo_user_envs:make_box_action_game")),
         "env.name: 'pz:nim': its action spaces Box(-1.0, 1.0, (2,), float32), Box(-1.0, 1.0, (2,), float32) are not "
         "one Discrete(A) for both agents; allowed: Discrete(A)"),
    Case("pz-user-game-unmasked", train(*NIM, *set_("env.import", "mpippo_user_envs:make_unmasked_game")),
         "is not a Dict of an 'observation' Box and an 'action_mask' Box (3,), the same for both agents"),
    Case("pz-import-module-only", train(*NIM, *set_("env.import", "mpippo_user_envs")),
         "env.import: 'mpippo_user_envs' is not module:callable (a function or class of your module that returns a "
         "PettingZoo AEC env"),
    Case("pz-user-game-named-as-a-classic-game", train(*NIM, *set_("env.name", "pz:tictactoe_v3")),
         "env.name: 'pz:tictactoe_v3' is PettingZoo's own game; give the game of env.import "
         "'mpippo_user_envs:make_nim' a name of its own"),
    Case("pz-user-game-name-malformed", train(*NIM, *set_("env.name", "pz:my game!")),
         "env.name: 'pz:my game!' is not pz:<name> with a name of letters, digits, _ . -"),
    Case("pz-user-game-kwargs-refused", train(*NIM, *set_("env.kwargs", "{board: 3}")),
         "env.name: 'pz:nim': a game cannot be made and read (TypeError: "),
    Case("pz-user-game-no-agent-selection", train(*NIM, *set_("env.import", "mpippo_user_envs:make_unselected_game")),
         "env.name: 'pz:nim': after reset() its agent_selection is None, not one of its agents ['first', 'second']; "
         "allowed: an AEC env whose reset() names the player to move"),
    Case("pz-user-game-text-observations", train(*NIM, *set_("env.import", "mpippo_user_envs:make_text_observation_game")),
         "env.name: 'pz:nim': making 4 and starting their games failed (returned an observation of <U1 values "
         "(ValueError: could not convert string to float: 'x')"),
    Case("pz-user-game-no-legal-move", train(*NIM, *set_("env.import", "mpippo_user_envs:make_no_legal_move_game")),
         "returned an action_mask with no legal move for a player whose turn it is"),
    Case("pz-mirror-augment", train("--config", "configs/dqn_selfplay.yaml", "--no-progress", "--total-timesteps", "512",
                                    *set_("env.name", "pz:tictactoe_v3"), ranks=3),
         "dqn.mirror_augment: the rules of 'pz:tictactoe_v3' are not left-right symmetric; allowed: connect4, "
         "pz:connect_four_v3"),
    Case("gym-box-actions-with-dqn", train(*CARTPOLE, *set_("training.algo", "dqn"), *set_("env.name", "gym:Pendulum-v1"),
                                           ranks=3),
         "training.algo: 'dqn' takes discrete actions, gym:Pendulum-v1 has continuous (Box) ones; allowed with "
         "gym:Pendulum-v1: a2c, ppo"),
    Case("gym-box-actions-with-appo", train(*USER, *set_("training.algo", "appo"),
                                            *set_("env.name", "gym:mpippo-test/Target-v0"), ranks=3),
         "training.algo: 'appo' takes discrete actions, gym:mpippo-test/Target-v0 has continuous (Box) ones"),
    Case("resume-gym-import-unnamed", on_user_run("--resume", "--no-progress", "--output-dir", "RUN"),
         "--resume: the run's config.yaml has env.import 'mpippo_user_envs'"),
    Case("resume-gym-import-other", on_user_run("--resume", "--no-progress", "--output-dir", "RUN",
                                                "--set", "env.import=json"),
         "--resume: --set env.import=json is not the run's env.import 'mpippo_user_envs'; allowed: --set "
         "env.import=mpippo_user_envs"),
    Case("evaluate-gym-import-unnamed", on_user_run("--checkpoint", "RUN", "--num-episodes", "2",
                                                    module="mpippo.evaluate"),
         "--import: the checkpoint's env gym:mpippo-test/Target-v0 comes from the module 'mpippo_user_envs'"),
    Case("evaluate-gym-import-other", on_user_run("--checkpoint", "RUN", "--num-episodes", "2", "--import", "json",
                                                  module="mpippo.evaluate"),
         "name it to allow it, --import mpippo_user_envs (got 'json')"),
    Case("ckpt-gym-obs-stats-shape", edited(lambda s: s["obs_rms"].update(mean=np.zeros(5))),
         "obs_rms.mean: expected a f array of shape (2,), got float64 (5,)"),
    Case("ckpt-gym-obs-stats-nan", edited(lambda s: s["obs_rms"].update(var=np.full(2, np.nan))),
         "obs_rms: non-finite mean or negative variance"),
    Case("ckpt-gym-continuous-flag", edited(lambda s: s["model_spec"].update(continuous="yes")),
         "model_spec.continuous: expected true or false"),
    Case("ckpt-gym-env-state", edited(lambda s: s["ranks"][0].update(env=[b"x"] * 4)),
         "ranks[0].env: expected none (a Gymnasium env's state is not saved)"),
    # atari:<Game> (ale-py) and the Nature CNN
    Case("atari-unknown-game", train(*ATARI, *set_("env.name", "atari:Pongg"), ranks=2),
         "env.name: 'Pongg' is not an ALE game (did you mean 'atari:Pong'?)"),
    Case("atari-game-path", train(*ATARI, *set_("env.name", "atari:../../etc/passwd")),
         "env.name: 'atari:../../etc/passwd' is not atari:<Game>"),
    Case("atari-kwargs-unknown", train(*ATARI, *set_("env.kwargs", "{frameskip: 2}")),
         "env.kwargs.frameskip: not an option of atari envs; allowed: repeat_action_probability"),
    Case("atari-kwargs-sticky-range", train(*ATARI, *set_("env.kwargs", "{repeat_action_probability: 1.5}")),
         "env.kwargs.repeat_action_probability: 1.5 is not a number in [0, 1]"),
    Case("atari-kwargs-steps-bool", train(*ATARI, *set_("env.kwargs", "{max_episode_steps: true}")),
         "env.kwargs.max_episode_steps: True is not an integer in [1, 10000000]"),
    Case("atari-import", train(*ATARI, *set_("env.import", "os")),
         "env.import: 'os' is read by gymnasium, pettingzoo envs only; env.name 'atari:Pong' is of the atari family: "
         "remove it"),
    Case("atari-nature-small-frames", train(*ATARI, *set_("env.name", "toy-cue")),
         "model.arch: nature takes frames of at least 36x36"),
    Case("atari-nature-channels", train(*ATARI, *set_("model.channels", "[8, 16]")),
         "model.channels: [8, 16] is read by model.arch impala only"),
    Case("atari-arch-unknown", train(*ATARI, *set_("model.arch", "resnet50")),
         "model.arch: 'resnet50' is not one of impala, nature"),
]
for _c in CASES:
    if _c.id.startswith(("resume-", "evaluate-", "ckpt-")):
        _c.slow = True
        _c.kept = lambda tmp, shared: [shared["run"]]


outcomes, test_hostile_env_input = hostile.table(CASES, "test_hostile_env_input", "user_run")


def test_every_class_of_env_input_is_covered():
    classes = ("-id", "kwargs", "import", "entry", "actions", "observations", "obs-", "resume-", "evaluate-", "ckpt-",
               "pz-", "atari-")
    assert hostile.uncovered(CASES, classes) == []


def test_an_env_gymnasium_warns_of_and_cannot_make_is_one_line():
    """Gymnasium warns that HalfCheetah-v3 is out of date, then cannot make it: the refusal is the one
    line on stderr, with what Gymnasium warned of inside it (its own warning printed lines before it)."""
    res = run([sys.executable, "run_mpi.py", *CARTPOLE, "--set", "env.name=gym:HalfCheetah-v3", "--output-dir",
               str(ROOT / "runs" / "never-made")], 120)
    assert res.returncode == 2 and res.stdout == "" and not (ROOT / "runs" / "never-made").exists()
    assert res.stderr.splitlines() == [res.stderr.strip()], res.stderr
    assert res.stderr.endswith("it warned: The environment HalfCheetah-v3 is out of date. You should consider upgrading "
                               "to version `v5`.\n"), res.stderr
