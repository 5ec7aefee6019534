import dataclasses
import os

import pytest
import yaml

from mpippo import config as C


def build(overrides: dict, world_size: int = 1, base: dict | None = None):
    items = [tuple(k.split(".", 1)) + (v,) for k, v in overrides.items()]
    return C.build(base if base is not None else C.load_yaml(C.DEFAULT_CONFIG), items, world_size)


def errors_of(overrides: dict, world_size: int = 1, base=None) -> list[str]:
    with pytest.raises(C.UsageError) as e:
        build(overrides, world_size, base)
    return e.value.errors


def test_default_config_is_the_procgen_paper_setting():
    cfg = build({})
    t = cfg.training
    assert (cfg.env.name, cfg.env.distribution_mode, cfg.env.num_envs, t.n_steps) == ("coinrun", "easy", 64, 256)
    assert (t.learning_rate, t.gamma, t.gae_lambda, t.n_epochs, t.num_minibatches) == (5e-4, 0.999, 0.95, 3, 8)
    assert (t.clip_range, t.ent_coef, t.vf_coef, t.max_grad_norm) == (0.2, 0.01, 0.5, 0.5)


def test_every_default_field_is_in_the_default_yaml():
    """configs/ppo_procgen.yaml restates the built-in defaults, every key with the same value (a
    default changed in one place and not the other would be a silent fork); the algorithm files
    state every key of their section."""
    data, defaults = C.load_yaml(C.DEFAULT_CONFIG), C.Config().to_dict()
    for section, cls in C._section_classes().items():
        # the PPO default leaves out the algorithms' own sections (and self-play); their configs have them
        if section not in (*C.registry.algorithm_sections(), "selfplay"):
            assert set(data[section]) == {C.file_key(section, f.name) for f in dataclasses.fields(cls)}, section
            differ = {k: (v, defaults[section][k]) for k, v in data[section].items() if v != defaults[section][k]}
            assert differ == {}, f"{section}: the default config and the built-in defaults differ: {differ}"
    dqn = C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_procgen.yaml")["dqn"]
    assert set(dqn) == {f.name for f in dataclasses.fields(C._section_classes()["dqn"])}
    appo = C.load_yaml(C.DEFAULT_CONFIG.parent / "appo_procgen.yaml")["appo"]
    assert set(appo) == {f.name for f in dataclasses.fields(C._section_classes()["appo"])}
    sp = C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_selfplay.yaml")["selfplay"]
    assert set(sp) == {f.name for f in dataclasses.fields(C.SelfPlayConfig)}


def test_unknown_key_names_it_and_suggests():
    (msg,) = errors_of({"training.learning_rat": 1e-3})
    assert "training.learning_rat" in msg and "did you mean 'learning_rate'" in msg


def test_wrong_type_names_value_and_type():
    (msg,) = errors_of({"training.n_steps": "abc"})
    assert msg == "training.n_steps: expected int, got 'abc' (str)"


def test_all_errors_reported_at_once():
    errs = errors_of({"training.gamma": 1.5, "training.n_epochs": 0, "env.name": "pong"})
    assert len(errs) == 3
    assert any("training.gamma" in e and "1.5" in e for e in errs)
    assert any("'pong'" in e and "coinrun" in e for e in errs)


def test_the_reward_normalizer_discount_is_gamma_unless_set_and_checked_like_it():
    assert C.resolve(build({}), 1).training.norm_gamma() == 0.999
    assert C.resolve(build({"training.reward_norm_gamma": 0.99}), 1).training.norm_gamma() == 0.99
    errs = errors_of({"training.reward_norm_gamma": -0.5})
    assert errs == ["training.reward_norm_gamma: must be in [0, 1], got -0.5"], errs


def test_env_name_aliases():
    assert C.resolve(build({"env.name": "procgen-starpilot-v0"}), 1).env.name == "starpilot"


def test_strong_scaling_divides_global_envs_and_rounds_remainders_up():
    cfg = C.resolve(build({}, world_size=4), 4)
    assert (cfg.env.num_envs_per_rank, cfg.env.num_envs) == (16, 64)
    assert C.envs_note(build({}, world_size=4), cfg, 4) is None
    # the default job on any core count: 64 envs over 3, 6, 12, 24, 48 ranks round up, never down
    for ranks, per_rank in ((3, 22), (6, 11), (12, 6), (24, 3), (48, 2)):
        asked = build({}, world_size=ranks)
        cfg = C.resolve(asked, ranks)
        assert (cfg.env.num_envs_per_rank, cfg.env.num_envs) == (per_rank, per_rank * ranks)
        assert f"{per_rank} per rank, {per_rank * ranks} in all" in C.envs_note(asked, cfg, ranks)
    # DQN: over the actors (3 ranks = 1 learner + 2 actors)
    dqn = C.resolve(build({"training.algo": "dqn", "env.num_envs": 7}, world_size=3), 3)
    assert (dqn.env.num_envs_per_rank, dqn.env.num_envs) == (4, 8)


def test_weak_scaling_per_rank_wins():
    cfg = C.resolve(build({"env.num_envs_per_rank": 5, "training.num_minibatches": 5}, world_size=3), 3)
    assert (cfg.env.num_envs_per_rank, cfg.env.num_envs) == (5, 15)


def test_minibatch_must_divide_local_batch():
    (msg,) = errors_of({"training.num_minibatches": 7})
    assert "num_minibatches=7" in msg and "64 envs x 256 steps = 16384" in msg


def test_non_positive_steps_and_bad_device():
    errs = errors_of({"training.total_timesteps": 0, "training.device": "tpu"})
    assert any("training.total_timesteps: must be > 0, got 0" == e for e in errs)
    assert any("'tpu'" in e for e in errs)


def test_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  n_steps: [1, 2\n")
    with pytest.raises(C.UsageError, match="malformed YAML .* line"):
        C.load_yaml(bad)
    with pytest.raises(C.UsageError, match="config file not found: '.*nope.yaml'"):
        C.load_yaml(tmp_path / "nope.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")  # refused by what it is, without opening it (that would block)
    with pytest.raises(C.UsageError, match="config file: '.*fifo.yaml' is a FIFO, not a regular file"):
        C.load_yaml(tmp_path / "fifo.yaml")


def test_override_parsing_types_values():
    assert C.parse_override("training.n_steps=128") == ("training", "n_steps", 128)
    assert build({"training.learning_rate": "3e-4"}).training.learning_rate == 3e-4  # YAML 1.1 reads it as str
    assert C.parse_override("env.num_envs_per_rank=null") == ("env", "num_envs_per_rank", None)
    with pytest.raises(C.UsageError, match="section.key=value"):
        C.parse_override("learning_rate")


def test_a_dotted_override_sets_one_entry_of_a_mapping_key():
    """--set env.kwargs.name=value sets that entry and keeps the others (the form the docs give for
    Atari's options); --set env.kwargs={...} still replaces the mapping; a dotted key into a key that is
    no mapping stays an unknown key; the file's data is not changed."""
    base = {"env": {"name": "atari:Pong", "kwargs": {"noop_max": 10}}}
    merged = C.merge_overrides(base, [C.parse_override("env.kwargs.repeat_action_probability=0.25")])
    assert merged["env"]["kwargs"] == {"noop_max": 10, "repeat_action_probability": 0.25}
    assert base["env"]["kwargs"] == {"noop_max": 10}
    cfg = build({"env.name": "atari:Pong", "env.kwargs.noop_max": 0, "env.kwargs.reward_clip": False})
    assert cfg.env.kwargs == {"noop_max": 0, "reward_clip": False}
    later = [C.parse_override(o) for o in ("env.kwargs.noop_max=3", "env.kwargs={reward_clip: false}")]
    assert C.merge_overrides(base, later)["env"]["kwargs"] == {"reward_clip": False}
    assert any("env.kwargs.noop_max: 5000 is not an integer in [0, 1000]" in e
               for e in errors_of({"env.name": "atari:Pong", "env.kwargs.noop_max": 5000}))
    assert any(e.startswith("unknown key 'training.learning_rate.x'")
               for e in errors_of({"training.learning_rate.x": 1}))


def test_describe_lists_every_key():
    text = C.describe()
    assert "training:" in text and "learning_rate" in text and "num_envs_per_rank" in text


def test_the_docs_document_every_config_key():
    readme = (C.DEFAULT_CONFIG.parent.parent / "docs" / "config.md").read_text()
    for line in C.describe(markdown=True).splitlines()[2:]:
        key = line.split("`")[1]
        assert f"`{key}`" in readme, f"docs/config.md lacks config key {key} (regenerate with python -m mpippo.config --markdown)"


@pytest.mark.parametrize("name", sorted(p.name for p in C.DEFAULT_CONFIG.parent.glob("*.yaml")))
def test_every_shipped_config_is_valid(name):
    data = C.load_yaml(C.DEFAULT_CONFIG.parent / name)
    ranks = 3 if data.get("training", {}).get("algo") == "dqn" else 2  # a learner and two actors, or two ranks
    cfg = C.build(data, [], ranks)
    assert cfg.training.total_timesteps > 0


def test_selfplay_needs_dqn_and_a_two_player_game():
    base = C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_selfplay.yaml")
    errs = errors_of({"env.name": "coinrun"}, 3, base)
    assert any("selfplay.enabled: self-play needs a two-player game, env.name is 'coinrun'" in e for e in errs)
    assert any("dqn.mirror_augment" in e for e in errs)
    errs = errors_of({"training.algo": "ppo"}, 3, base)
    assert any("selfplay.enabled: self-play runs in the DQN learner layout" in e for e in errs)
    assert any("model.downsample: false is for the DQN network" in e for e in errs)
    errs = errors_of({"selfplay.sampling": "best", "selfplay.pool_size": 0, "selfplay.opponent_eps": 2}, 3, base)
    assert any("selfplay.sampling: 'best' is not one of latest, uniform, prioritized" in e for e in errs)
    assert any("selfplay.pool_size: must be >= 1, got 0" in e for e in errs)
    assert any("selfplay.opponent_eps: must be in [0, 1], got 2" in e for e in errs)


@pytest.mark.parametrize("config", ["toy_cue.yaml", "dqn_connect4.yaml"])
def test_the_selfplay_sections_values_are_checked_and_named_where_self_play_is_off(config):
    """PPO, and DQN without selfplay.enabled: a bad value there is refused as where self-play is on (it
    stayed in config.yaml until self-play was switched on), and a good one away from its default is
    named in the start-up warning, which has no effect without self-play."""
    bad = {"selfplay.sampling": "best", "selfplay.drop": "random", "selfplay.pool_size": 0}
    errs = errors_of(bad, 3, C.load_yaml(CONFIGS / config))
    assert [e for e in errs if e.startswith("selfplay.")] == [
        "selfplay.pool_size: must be >= 1, got 0", "selfplay.sampling: 'best' is not one of latest, uniform, prioritized",
        "selfplay.drop: 'random' is not one of oldest, lowest_rated"], errs
    cfg = C.build(C.load_yaml(CONFIGS / config), [("selfplay", "pool_size", 3)], 3)
    assert "selfplay.enabled is false, so self-play's settings have no effect: selfplay.pool_size=3" in C.ignored_note(cfg)
    assert C.ignored_note(C.build(C.load_yaml(CONFIGS / "dqn_selfplay.yaml"), [("selfplay", "pool_size", 3)], 3)) is None


# ---- the actor-learner sections: ranges, impossible combinations, memory ----
CONFIGS = C.DEFAULT_CONFIG.parent


def layout_errors(name: str, overrides: dict, world_size: int = 3) -> list[str]:
    return errors_of(overrides, world_size, C.load_yaml(CONFIGS / name))


@pytest.mark.parametrize("name,key,value,expect", [
    ("dqn_toy.yaml", "dqn.per_alpha", 2.0, "dqn.per_alpha: must be in [0, 1], got 2.0"),
    ("dqn_toy.yaml", "dqn.replay_ratio", 1e6, "dqn.replay_ratio: must be in [0, 1024], got 1000000.0"),
    ("dqn_toy.yaml", "dqn.replay_ratio", -1, "dqn.replay_ratio: must be in [0, 1024], got -1.0"),
    ("dqn_toy.yaml", "dqn.eps_alpha", -0.5, "dqn.eps_alpha: must be >= 0, got -0.5"),
    ("dqn_toy.yaml", "dqn.max_inflight", 0, "dqn.max_inflight: must be >= 1, got 0"),
    ("dqn_toy.yaml", "dqn.learning_starts", 1e308, "dqn.learning_starts: expected int"),
    ("dqn_toy.yaml", "dqn.eps", ".nan", "dqn.eps: must be a finite number, got nan"),
    ("appo_toy.yaml", "appo.epochs", 0, "appo.epochs: must be in [1, 1000], got 0"),
    ("appo_toy.yaml", "appo.max_policy_lag", -1, "appo.max_policy_lag: must be >= 0, got -1"),
    ("appo_toy.yaml", "appo.rho_bar", 1e400, "appo.rho_bar: must be a finite number, got inf"),
    ("dqn_selfplay.yaml", "selfplay.elo_k", 1e18, "selfplay.elo_k: must be in [0, 400], got 1e+18"),
    ("dqn_selfplay.yaml", "selfplay.priority_exponent", 1e9, "selfplay.priority_exponent: must be in [0, 100]"),
    ("dqn_selfplay.yaml", "selfplay.eval_games", 0, "selfplay.eval_games: must be in [1, 100000], got 0"),
    ("toy_cue.yaml", "training.rollout_cutoff", 0, "training.rollout_cutoff: must be in (0, 1]"),
    ("toy_cue.yaml", "training.rollout_cutoff", 1.5, "training.rollout_cutoff: must be in (0, 1]"),
    ("toy_cue.yaml", "training.rollout_cutoff", ".nan", "training.rollout_cutoff: must be a finite number, got nan"),
    ("toy_cue.yaml", "training.rollout_min_fraction", 0, "training.rollout_min_fraction: must be in (0, 1], got 0"),
    ("dqn_selfplay.yaml", "selfplay.eval_games", 10**12, "selfplay.eval_games: must be in [1, 100000], got 10000000"),
    ("appo_toy.yaml", "appo.epochs", 10**9, "appo.epochs: must be in [1, 1000], got 1000000000"),
    ("dqn_selfplay.yaml", "selfplay.snapshot_interval_updates", 10**20, "is out of range; allowed: below 2**63"),
])
def test_actor_learner_keys_are_range_checked(name, key, value, expect):
    errs = layout_errors(name, {key: yaml.safe_load(value) if isinstance(value, str) else value})
    assert len(errs) == 1 and expect in errs[0], errs


def test_replay_thresholds_above_the_replay_are_refused_once():
    (msg,) = layout_errors("dqn_toy.yaml", {"dqn.learning_starts": 30000})  # above the replay and the budget: one line
    assert msg == ("dqn.learning_starts: 30,000 is above dqn.buffer_size=20,000: the replay never holds that many "
                   "transitions, so no update would ever happen; allowed: <= 20,000")
    (msg,) = layout_errors("dqn_toy.yaml", {"dqn.batch_size": 30000})
    assert msg.startswith("dqn.batch_size: 30,000 is above dqn.buffer_size=20,000") and "allowed: <= 20,000" in msg


def test_a_budget_too_small_to_start_learning_is_refused_with_its_formula():
    """dqn_toy on 3 ranks: 2 actors x 8 envs; 3,000 steps are 187 per env, 2,992 transitions."""
    (msg,) = layout_errors("dqn_toy.yaml", {"training.total_timesteps": 3000, "dqn.learning_starts": 3000})
    assert msg.startswith("dqn.learning_starts: 3,000 is not below the transitions the actors make over the budget "
                          "(2 actor(s) x (187 steps - dqn.n_step 1 + 1) x 8 envs = 2,992, with training.total_timesteps "
                          "3,000 // 1 agent(s) // 2 actor(s) // 8 envs = 187 steps per env)"), msg
    assert msg.endswith("allowed: < 2,992 (or raise training.total_timesteps)")
    # n-step returns need n steps per env
    (msg,) = layout_errors("dqn_toy.yaml", {"dqn.n_step": 10**9, "dqn.learning_starts": 0})
    assert msg.startswith("training.total_timesteps: 24,000 // 1 agent(s) // 2 actor(s) // 8 envs = 1,500 steps per env, "
                          "fewer than dqn.n_step=1,000,000,000: no transition would ever be made"), msg
    # the replay ratio pays for less than one update
    (msg,) = layout_errors("dqn_toy.yaml", {"dqn.replay_ratio": 0.001})
    assert msg.startswith("dqn.replay_ratio: 0.001 x (24,000 transitions - dqn.learning_starts 1,000) / "
                          "dqn.batch_size 64 = 0 updates over the budget") and "allowed: >= 0.002783" in msg
    # replay_ratio 0 collects only (benchmarks/bench_dqn.py): allowed
    C.build(C.load_yaml(CONFIGS / "dqn_toy.yaml"), [("dqn", "replay_ratio", 0)], 3)


def test_a_chunk_larger_than_an_actor_makes_is_refused():
    (msg,) = layout_errors("dqn_toy.yaml", {"dqn.chunk_size": 10**9})
    assert msg.startswith("dqn.chunk_size: 1,000,000,000 transitions per message, but each actor makes only 12,000 "
                          "over the budget") and msg.endswith("allowed: <= 12,000"), msg
    (msg,) = layout_errors("appo_toy.yaml", {"appo.chunk_size": 64, "appo.batch_segments": 64,
                                             "training.total_timesteps": 1024})
    assert msg.startswith("appo.chunk_size: 64 segments per message, but an actor makes at most 32 over the budget "
                          "(training.total_timesteps 1,024 // 1 agent(s) // (16 envs x appo.rollout_length 16) = "
                          "4 round(s) of 16 segments, over 2 actor(s))"), msg


def test_appo_budgets_that_never_fill_a_batch_are_refused():
    (msg,) = layout_errors("appo_toy.yaml", {"appo.batch_segments": 10**9, "appo.num_minibatches": 1})
    assert msg.startswith("appo.batch_segments: 1,000,000,000 segments per update, but the actors make only 2,560 over "
                          "the budget (training.total_timesteps 40,960 // 1 agent(s) // (16 envs x "
                          "appo.rollout_length 16) = 160 round(s) of 16 segments)") and "allowed: <= 2,560" in msg, msg
    (msg,) = layout_errors("appo_toy.yaml", {"appo.rollout_length": 10**9})
    assert msg.startswith("training.total_timesteps: 40,960 // 1 agent(s) // (16 envs x appo.rollout_length "
                          "1,000,000,000) = 0 round(s) of 16 segments: no segment would ever be made"), msg
    (msg,) = layout_errors("appo_toy.yaml", {"appo.chunk_size": 100})
    assert msg.startswith("appo.chunk_size: a message of 100 segments is more than the learner keeps between two "
                          "updates (a batch and one more: 2 x appo.batch_segments = 64): 36 segments of each would be "
                          "dropped; allowed: <= 64"), msg


def test_every_test_and_benchmark_layout_stays_valid():
    """The budgets the suite and the benchmarks run the layout with are not refused."""
    for name, sets, ranks in [
            ("dqn_toy.yaml", {"training.total_timesteps": 3000, "dqn.learning_starts": 500}, 3),
            ("dqn_toy.yaml", {"training.total_timesteps": 6000}, 3),
            ("dqn_toy.yaml", {"dqn.learning_starts": 200, "dqn.max_episodes": 300, "dqn.learning_steps_per_batch": 8,
                              "training.total_timesteps": 10**12}, 3),
            ("dqn_connect4.yaml", {"training.total_timesteps": 2048, "dqn.learning_starts": 500}, 3),
            ("dqn_connect4.yaml", {"training.total_timesteps": 4096, "selfplay.enabled": True}, 3),
            ("dqn_selfplay.yaml", {"training.total_timesteps": 12000, "dqn.learning_starts": 1000,
                                   "selfplay.snapshot_interval_updates": 20, "selfplay.pool_size": 3}, 3),
            ("dqn_procgen.yaml", {"training.total_timesteps": 1200, "dqn.learning_starts": 800, "dqn.batch_size": 32,
                                  "dqn.replay_ratio": 8, "dqn.buffer_size": 20000, "env.num_envs_per_rank": 8}, 3),
            ("dqn_procgen.yaml", {"training.total_timesteps": 8000, "dqn.replay_ratio": 0, "dqn.buffer_size": 20000,
                                  "env.num_envs_per_rank": 8}, 2),
            ("appo_toy.yaml", {"training.total_timesteps": 2048}, 3),
            ("appo_toy.yaml", {"training.total_timesteps": 4096}, 3),
            ("appo_procgen.yaml", {"training.total_timesteps": 1024, "env.num_envs_per_rank": 16,
                                   "appo.batch_segments": 8, "appo.rollout_length": 8}, 4)]:
        C.build(C.load_yaml(CONFIGS / name), [tuple(k.split(".", 1)) + (v,) for k, v in sets.items()], ranks)


def test_chunk_bytes_is_the_message_layout(monkeypatch):
    from mpippo.algos.apex import chunk_fields
    from mpippo.algos.appo import segment_fields
    from mpippo.algos.dqn_settings import legal_words
    from mpippo.comm.p2p import ChunkLayout
    gym = [("env", "name", "gym:CartPole-v1")]  # vector observations: float32
    monkeypatch.syspath_prepend(str(CONFIGS.parent / "tests" / "user_env"))
    nim = [("env", "name", "pz:nim"), ("env", "import", "mpippo_user_envs:make_nim"), ("dqn", "mirror_augment", False),
           ("env", "kwargs", {"stones": 100, "max_take": 70})]  # 70 moves: two words of legal-move bits
    for name, ranks, sets in (("dqn_toy.yaml", 3, []), ("dqn_selfplay.yaml", 3, []), ("appo_toy.yaml", 3, []),
                              ("dqn_cartpole.yaml", 3, []), ("appo_toy.yaml", 3, gym), ("dqn_selfplay.yaml", 3, nim)):
        cfg = C.resolve(C.build(C.load_yaml(CONFIGS / name), sets, ranks), ranks)
        shape, sec = C.obs_shape_of(cfg), C.layout_section(cfg)
        if cfg.training.algo == "dqn":
            fields, capacity = chunk_fields(shape, legal_words(cfg)), max(sec.chunk_size, cfg.env.num_envs_per_rank)
            assert legal_words(cfg) == (2 if sets is nim else 1)
        else:
            fields, capacity = segment_fields(shape, cfg.appo.rollout_length), sec.chunk_size * cfg.appo.rollout_length
        rows = cfg.selfplay.pool_size + 4 if cfg.selfplay.enabled else 0
        layout = ChunkLayout(sec.chunk_size, fields, results_rows=rows, episode_capacity=capacity)
        assert C.chunk_bytes(cfg, ranks) == layout.nbytes, name


def test_the_learner_memory_floor_counts_the_replay_and_network_copies():
    from mpippo.algos.dqn import PrioritizedReplay
    cfg = C.resolve(C.build(C.load_yaml(CONFIGS / "dqn_toy.yaml"), [], 3), 3)
    learner, actor = C.layout_memory(cfg, 3)
    replay = next(b for b, what, _ in learner if what.startswith("replay"))
    assert replay == PrioritizedReplay.nbytes(20000, C.obs_shape_of(cfg))
    params = C.network_params(C.obs_shape_of(cfg), [8, 16], 64)
    assert any(b == 24 * params and "target" in what for b, what, _ in learner)
    assert C.memory_floor(cfg, 3)[0] == sum(b for b, _, _ in actor)  # memory_floor: one env-stepping rank
    cfg = C.resolve(C.build(C.load_yaml(CONFIGS / "dqn_cartpole.yaml"), [], 3), 3)  # vectors: the Q-network's MLP
    learner, _ = C.layout_memory(cfg, 3)
    replay = next(b for b, what, _ in learner if what.startswith("replay"))
    assert replay == PrioritizedReplay.nbytes(50000, (4,))
    from mpippo.models.mlp import MLPQNetwork
    params = sum(p.numel() for p in MLPQNetwork(4, 2, (128, 128)).parameters())
    assert C.mlp_params(4, [128, 128], 2, "q") == params
    assert any(b == 24 * params and "target" in what for b, what, _ in learner)


@pytest.mark.parametrize("name,key,value,lower", [
    ("dqn_toy.yaml", "dqn.buffer_size", 10**12, "lower dqn.buffer_size"),
    ("dqn_toy.yaml", "dqn.max_inflight", 10**9, "lower dqn.chunk_size, dqn.max_inflight"),
    ("appo_toy.yaml", "appo.max_inflight", 10**9, "lower appo.chunk_size, appo.max_inflight"),
    ("dqn_selfplay.yaml", "selfplay.pool_size", 10**12, "lower selfplay.pool_size"),
    ("dqn_selfplay.yaml", "model.hidden_size", 10**7, "lower model.hidden_size, model.channels"),
])
def test_layout_sizes_beyond_the_node_are_refused_naming_the_keys(name, key, value, lower):
    cfg = C.resolve(C.build(C.load_yaml(CONFIGS / name), [tuple(key.split(".", 1)) + (value,)], 3), 3)
    (msg,) = C.host_problems(cfg, 3, 3)
    assert msg.startswith("memory: this config needs at least ") and "1 learner(s) x" in msg and "2 actor(s) x" in msg
    named = msg.rsplit("; lower ", 1)[1].split(", ")
    assert set(lower.removeprefix("lower ").split(", ")) <= set(named), msg


def test_a_huge_appo_batch_is_refused_on_the_learner_node_only_as_it_needs(monkeypatch):
    """1,000,000 segments of 17 frames: the learner's batch and its V-trace pass, tens of GiB."""
    cfg = C.resolve(C.build(C.load_yaml(CONFIGS / "appo_toy.yaml"),
                            [("appo", "batch_segments", 10**6), ("appo", "num_minibatches", 1),
                             ("training", "total_timesteps", 10**12)], 3), 3)
    learner, actor = C.layout_memory(cfg, 3)
    one_learner, one_actor = sum(b for b, _, _ in learner), sum(b for b, _, _ in actor)
    assert one_learner > 30 * 2**30 > 2**20 > one_actor
    monkeypatch.setattr(C.memory, "memory_available", lambda ranks: one_learner + 3 * one_actor)
    assert C.host_problems(cfg, 3, 3) == []  # fits: the node's memory is not split evenly over the ranks
    monkeypatch.setattr(C.memory, "memory_available", lambda ranks: one_learner - 1)
    (msg,) = C.host_problems(cfg, 3, 3)
    assert "lower appo.batch_segments, appo.rollout_length" in msg, msg
    # 6 ranks of 2 agents on nodes of 2 ranks: a node holds at most one learner (and its actor)
    two = C.resolve(C.build(C.load_yaml(CONFIGS / "appo_toy.yaml"),
                            [("appo", "batch_segments", 10**6), ("appo", "num_minibatches", 1), ("appo", "num_agents", 2),
                             ("training", "total_timesteps", 10**12)], 6), 6)
    monkeypatch.setattr(C.memory, "memory_available", lambda ranks: one_learner + 2 * one_actor)
    assert C.host_problems(two, 6, 2) == [] and C.host_problems(two, 6, 6) != []


def test_a_cutoff_that_could_leave_a_minibatch_empty_is_refused():
    """2 ranks x 16 envs x 32 steps, 4 minibatches: a rank kept to 1 of 32 steps holds 16 samples
    (enough); 4 minibatches of 1 env are not."""
    base = C.load_yaml(CONFIGS / "toy_cue.yaml")
    assert build({"training.rollout_cutoff": 0.5, "training.rollout_min_fraction": 0.01}, 2, base)
    errs = errors_of({"training.rollout_cutoff": 0.5, "training.rollout_min_fraction": 0.01, "env.num_envs": 2,
                      "training.num_minibatches": 4}, 2, base)
    assert any("training.rollout_min_fraction: 0.01 of 32 steps x 1 envs is fewer samples than "
               "training.num_minibatches=4" in e for e in errs), errs


def test_a_saved_config_older_than_a_key_reads_as_the_value_its_code_ran(tmp_path):
    """model.init became glorot by default; a run whose config.yaml predates the key ran PyTorch's
    init, and reads so (suite reports, resumes), while a config a user writes gets today's default."""
    from mpippo.files import read_run_config
    old = C.Config().to_dict()
    del old["model"]["init"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    assert read_run_config(tmp_path).model.init == "torch"
    old["model"]["init"] = "glorot"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    assert read_run_config(tmp_path).model.init == "glorot"
    assert C.build({"model": {"hidden_size": 64}}, [], 1).model.init == "glorot"
    assert C.with_earlier_defaults({"model": None}) == {"model": {"init": "torch"}}
    assert C.with_earlier_defaults(["not", "a", "mapping"]) == ["not", "a", "mapping"]  # from_dict refuses it
    assert C.with_earlier_defaults({"model": []}) == {"model": []}  # and a damaged section


def test_a_saved_config_from_before_the_guard_was_dropped_resumes_on_another_world_size():
    """config.yaml written by code that still saved parallel.expected_world_size: the key guarded
    that launch only, so reading the run's config drops it (a resume on 4 ranks of a 2-rank run)."""
    saved = {"parallel": {"expected_world_size": 2, "threads_per_rank": 1}, "training": {"seed": 3}}
    data = C.with_earlier_defaults(saved)
    assert data["parallel"] == {"threads_per_rank": 1} and saved["parallel"]["expected_world_size"] == 2
    assert C.build(data, [], 4).parallel.expected_world_size is None
    # given again on the command line, it guards this launch
    with pytest.raises(C.UsageError, match=r"parallel.expected_world_size: 2 ranks expected, but this job has 4; "
                                           r"allowed: a job of 2 ranks \(mpirun -n 2\), or null for any"):
        C.build(data, [("parallel", "expected_world_size", 2)], 4)
    with pytest.raises(C.UsageError, match="parallel.expected_world_size: 2 tasks were allocated but this job has 1 "
                                           "rank.s.; the launcher started separate jobs"):
        C.build(data, [("parallel", "expected_world_size", 2)], 1)


@pytest.mark.parametrize("bad", [0, -3])
def test_expected_world_size_below_one_names_what_is_allowed(bad):
    with pytest.raises(C.UsageError) as e:
        C.build({}, [("parallel", "expected_world_size", bad)], 1)
    assert e.value.errors == [f"parallel.expected_world_size: must be a number of ranks >= 1 (the tasks the job was "
                              f"given), or null for any; got {bad}"]


def test_exponent_floats_are_numbers_as_typed_and_a_run_config_reads_back_as_written(tmp_path):
    """What a person types reads 1e-3 and 1.5e3 as numbers (YAML 1.2; PyYAML's YAML 1.1 gave the text '1e-3'
    to a user's env). A run's config.yaml is PyYAML's YAML 1.1, which writes the text 1e5 unquoted: read with
    the typed rule, a text setting came back a number (refused on --resume) and an env's text kwarg changed type."""
    for typed, value in [("1e-3", 0.001), ("1.5e3", 1500.0), (".5E-2", 0.005), ("-1.e3", -1000.0), ("1e", "1e"),
                         ("1.2.3e4", "1.2.3e4"), ("'1e5'", "1e5")]:
        assert C.parse_override(f"env.kwargs.x={typed}")[2] == value, typed
    written = {"env": {"kwargs": {"map": "2e4", "x": 1e-5}}, "logging": {"run_name": "1e5"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    assert C.load_yaml(tmp_path / "config.yaml", ours=True) == written
    assert C.load_yaml(tmp_path / "config.yaml")["env"]["kwargs"]["map"] == 20000.0  # (typed by a person: a number)


def test_the_budget_note_says_where_a_sync_run_ends_past_its_budget():
    """Whole updates of 1,024 steps: 1,500 ends at 2,048; whole budgets, timed training and the balanced
    cut-off on several ranks (its updates vary) say nothing; the cut-off on one rank, where it does nothing,
    still does. A budget reached already (a resume), timed or not, says that nothing is trained."""
    from mpippo.cli import budget_note
    cfg = lambda *sets: C.build({}, [("training", "total_timesteps", 1500), *sets], 1)  # noqa: E731
    assert budget_note(cfg(), 0, 1024, 1).endswith("the run ends at 2,048, after 2 update(s)")
    assert budget_note(cfg(), 1024, 1024, 1).endswith("from 1,024: the run ends at 2,048, after 1 update(s)")
    assert budget_note(cfg(("training", "total_timesteps", 2048)), 0, 1024, 1) is None
    assert budget_note(cfg(), 2048, 1024, 1) == ("training.total_timesteps 1,500 is reached already (2,048 env "
                                                 "steps done): nothing is trained and the run ends as it is; a "
                                                 "larger --total-timesteps trains on")
    assert budget_note(cfg(("training", "duration_hours", 1.0)), 1500, 1024, 1).startswith("training.total_timesteps "
                                                                                         "1,500 is reached already")
    from mpippo.runctl import spent_note  # (the actor-learner layout's words: a share, less than a round)
    assert spent_note("its share, 1,024, of training.total_timesteps 2,048", 1024, 1024, 0, "this agent trains "
                      "nothing") == ("its share, 1,024, of training.total_timesteps 2,048 is reached already (1,024 "
                                     "env steps done): this agent trains nothing")
    assert spent_note("x 1,030", 1030, 1024, 0).startswith("x 1,030 leaves less than one round of its actors' steps")
    assert spent_note("x 1,030", 1030, 1024, 6) is None and spent_note("x 0", 0, 0, 0) is None
    assert budget_note(cfg(("training", "duration_hours", 1.0)), 0, 1024, 1) is None
    assert budget_note(cfg(("training", "rollout_cutoff", 0.75)), 0, 1024, 2) is None
    assert budget_note(cfg(("training", "rollout_cutoff", 0.75)), 0, 1024, 1) is not None


def test_config_yaml_keeps_what_the_job_derives_as_asked_so_resizes_never_drift():
    """A run resized at every resume (3, 4, 3, 2, 4, 5, 3 ranks) from its own config.yaml: each size
    rounds the asked 64 envs up for itself, never a total an earlier size rounded (64 -> 66 -> 68 ... had
    crept to 75); auto precision and threads stay auto for the next node to settle."""
    asked = C.build(C.load_yaml(C.DEFAULT_CONFIG.parent / "toy_cue.yaml"), [("env", "num_envs", 64)], 3)
    totals = []
    for ranks in (3, 4, 3, 2, 4, 5, 3):
        asked = C.build(asked if isinstance(asked, dict) else asked.to_dict(), [], ranks)
        ran = C.resolve(asked, ranks)
        ran.training.precision, ran.parallel.threads_per_rank, ran.env.num_threads = "bf16", 2, 5  # as settled
        totals.append(ran.env.num_envs)
        asked = yaml.safe_load(yaml.safe_dump(C.saved_form(ran, asked)))
        assert (asked["env"]["num_envs"], asked["env"]["num_envs_per_rank"]) == (64, None)
        assert (asked["training"]["precision"], asked["parallel"]["threads_per_rank"]) == ("auto", 0)
        assert asked["env"]["num_threads"] == C.EnvConfig().num_threads
    assert totals == [66, 64, 66, 64, 64, 65, 66]
    weak = C.build(C.load_yaml(C.DEFAULT_CONFIG.parent / "toy_cue.yaml"), [("env", "num_envs_per_rank", 5)], 3)
    assert C.saved_form(C.resolve(weak, 3), weak)["env"]["num_envs_per_rank"] == 5  # set: kept as set


@pytest.mark.parametrize("value", ["[-64]", "['a']", "[1.5]", "[true]", "[0]", "[64, null]"])
def test_mlp_sizes_are_widths_or_refused_in_one_line(value):
    """Each had passed the checks: a traceback at the network's build (negative, float, bool), in the memory
    check (text), or a dead network of 3 parameters (0)."""
    errs = errors_of({"model.mlp_sizes": yaml.safe_load(value)}, 1, C.load_yaml(CONFIGS / "ppo_cartpole.yaml"))
    assert errs == [f"model.mlp_sizes: must be a list of positive ints (hidden layer widths; [] for a linear policy), "
                    f"got {C.show(yaml.safe_load(value))}"], errs
    assert build({"model.mlp_sizes": []}, 1, C.load_yaml(CONFIGS / "ppo_cartpole.yaml")).model.mlp_sizes == []


def test_train_dqns_overrides_reach_the_config_as_python_gave_them(capsys):
    """train_dqn had written each value with str() into a --set: None arrived as 'None', backslashes
    doubled, a quote or a tuple refused in words that named neither, "2024" read as an int."""
    from mpippo import api
    given = {"env.kwargs": {"x": None, "path": "C:\\data\\x", "q": "it's \"q\"", "deep": [1, {"b": None}]},
             "model.mlp_sizes": (32, 32), "logging.wandb_project": "2024"}
    argv = api._argv({}, given, None, None, "~/runs/x")
    sets = {f"{s}.{k}": v for s, k, v in (C.parse_override(a) for a in argv[argv.index("--set") + 1::2])}
    assert sets == {"env.kwargs": {"x": None, "path": "C:\\data\\x", "q": "it's \"q\"", "deep": [1, {"b": None}]},
                    "model.mlp_sizes": [32, 32], "logging.wandb_project": "2024"}
    assert argv[argv.index("--output-dir") + 1] == os.path.expanduser("~/runs/x")
    for bad, said in (({"overrides": "dqn.x=1"}, "overrides: expected a dict"),
                      ({"num_workers": "1"}, "num_workers: expected a whole number >= 1 or None, got '1'"),
                      ({"output_dir": b"/x"}, "output_dir: expected a path (str or pathlib.Path) or None, got bytes"),
                      ({"overrides": {"training.algo": "ppo"}}, "train_dqn trains dqn; run run_mpi.py for ppo")):
        args = {"overrides": None, "num_workers": None, "config": None, "output_dir": None, **bad}
        with pytest.raises(SystemExit) as e:
            api._argv({}, args["overrides"], args["num_workers"], args["config"], args["output_dir"])
        assert e.value.code == 2 and said in capsys.readouterr().err
