import pytest

from mpippo import config as C


def build(overrides: dict, world_size: int = 1, base: dict | None = None):
    items = [tuple(k.split(".", 1)) + (v,) for k, v in overrides.items()]
    return C.build(base if base is not None else C.load_yaml(C.DEFAULT_CONFIG), items, world_size)


def errors_of(overrides: dict, world_size: int = 1, base=None) -> list[str]:
    with pytest.raises(C.ConfigError) as e:
        build(overrides, world_size, base)
    return e.value.errors


def test_default_config_is_the_procgen_paper_setting():
    cfg = build({})
    t = cfg.training
    assert (cfg.env.name, cfg.env.distribution_mode, cfg.env.num_envs, t.n_steps) == ("coinrun", "easy", 64, 256)
    assert (t.learning_rate, t.gamma, t.gae_lambda, t.n_epochs, t.num_minibatches) == (5e-4, 0.999, 0.95, 3, 8)
    assert (t.clip_range, t.ent_coef, t.vf_coef, t.max_grad_norm) == (0.2, 0.01, 0.5, 0.5)


def test_every_default_field_is_in_the_default_yaml():
    data = C.load_yaml(C.DEFAULT_CONFIG)
    for section, cls in C._section_classes().items():
        if section not in ("dqn", "appo", "selfplay"):  # the PPO default leaves them out; their configs have them
            assert set(data[section]) == {f.name for f in C.dataclasses.fields(cls)}, section
    dqn = C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_procgen.yaml")["dqn"]
    assert set(dqn) == {f.name for f in C.dataclasses.fields(C.DQNConfig)}
    appo = C.load_yaml(C.DEFAULT_CONFIG.parent / "appo_procgen.yaml")["appo"]
    assert set(appo) == {f.name for f in C.dataclasses.fields(C.APPOConfig)}
    sp = C.load_yaml(C.DEFAULT_CONFIG.parent / "dqn_selfplay.yaml")["selfplay"]
    assert set(sp) == {f.name for f in C.dataclasses.fields(C.SelfPlayConfig)}


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
    with pytest.raises(C.ConfigError, match="malformed YAML .* line"):
        C.load_yaml(bad)
    with pytest.raises(C.ConfigError, match="config file not found: '.*nope.yaml'"):
        C.load_yaml(tmp_path / "nope.yaml")


def test_override_parsing_types_values():
    assert C.parse_override("training.n_steps=128") == ("training", "n_steps", 128)
    assert build({"training.learning_rate": "3e-4"}).training.learning_rate == 3e-4  # YAML 1.1 reads it as str
    assert C.parse_override("env.num_envs_per_rank=null") == ("env", "num_envs_per_rank", None)
    with pytest.raises(C.ConfigError, match="section.key=value"):
        C.parse_override("learning_rate")


def test_describe_lists_every_key():
    text = C.describe()
    assert "training:" in text and "learning_rate" in text and "num_envs_per_rank" in text


def test_readme_documents_every_config_key():
    readme = (C.DEFAULT_CONFIG.parent.parent / "README.md").read_text()
    for line in C.describe(markdown=True).splitlines()[2:]:
        key = line.split("`")[1]
        assert f"`{key}`" in readme, f"README lacks config key {key} (regenerate with python -m mpippo.config --markdown)"


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
