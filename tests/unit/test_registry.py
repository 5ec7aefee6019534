"""The algorithm registry: one entry per algorithm, light enough for the config to read, complete
enough that nothing else needs to branch on an algorithm's name."""
import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from mpippo import config as C
from mpippo.algos import implementations, registry

ROOT = Path(__file__).resolve().parents[2]


def test_the_config_reads_the_registry_without_loading_torch():
    """A bad config is refused before torch loads (cli.py's phase C): the registry, its entries and
    the sections they bring must stay light."""
    code = "import sys, mpippo.config as C; print(C.ALGOS, 'torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-1] == "False", res.stdout


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_entry_is_complete(name):
    a = registry.get(name)
    assert a.layout in registry.LAYOUTS and a.name in C.ALGOS and a.summary.startswith(name)
    impl = implementations.load(name)
    assert callable(impl.check_checkpoint)
    assert callable(a.check)
    if a.layout == registry.SYNC:
        for method in ("optimizer", "update"):
            assert callable(getattr(impl, method)), method
        section, key = a.minibatches_key.split(".")
        assert key in {f.name for f in dataclasses.fields(C._section_classes()[section])}
    else:
        assert a.section in C.SECTIONS or a.section in C._section_classes()
        assert callable(a.memory) and callable(a.chunk_items)
    if a.section is not None:
        assert a.section in C._section_classes() and a.section in registry.algorithm_sections()
    cfg = C.Config()
    cfg.training.algo = name
    net = a.build_network(cfg, (8, 8, 3), 4)
    out = net(__import__("torch").zeros((2, 8, 8, 3), dtype=__import__("torch").uint8))
    assert (out.shape if a.network == "q" else out[0].shape) == (2, 4)


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_entry_satisfies_its_layouts_protocol(name):
    """algos/contracts.py: the members its runner uses, on a real instance (vector observations),
    and for the actor-learner layout its actor's half too."""
    import numpy as np

    from mpippo.algos import contracts
    a = registry.get(name)
    cfg = C.Config()
    cfg.training.algo = name
    protocol = contracts.protocol_of(a.layout)
    if a.layout == registry.SYNC:
        algo = implementations.load(name)(cfg)
        assert contracts.missing(algo, protocol) == [] and isinstance(algo, protocol)
        return
    algo = implementations.load(name)(cfg, (4,), 2, num_actors=2)
    assert contracts.missing(algo, protocol) == [] and isinstance(algo, protocol)
    acting = algo.actor(0, algo.new_net(), 3, np.random.default_rng(0))
    assert contracts.missing(acting, contracts.Acting) == [] and isinstance(acting, contracts.Acting)


def test_the_contract_check_names_what_is_missing():
    from mpippo.algos import contracts

    class Half:
        gae_lambda = 0.95

        def optimizer(self, params):
            return None
    assert contracts.missing(Half(), contracts.SyncAlgorithm) == ["allreduces_per_iteration", "check_checkpoint",
                                                                  "update"]
    assert not isinstance(Half(), contracts.SyncAlgorithm)


def test_every_entry_has_its_class_and_every_class_its_entry():
    """registry.ENTRIES (light) and implementations.CLASSES (torch) list the same algorithms, and each
    entry sits in its own torch-free <name>_settings module, beside nothing heavier."""
    from mpippo.algos import implementations
    assert sorted(implementations.CLASSES) == sorted(registry.NAMES)
    for entry in registry.ENTRIES:
        module = sys.modules[entry.check.__module__]
        assert module.__name__ == f"mpippo.algos.{entry.name}_settings" and module.ALGORITHM is entry


def _is_algo(node) -> bool:
    """`algo`, `x.algo`, `x["algo"]`: the run's or a checkpoint's algorithm."""
    return (isinstance(node, ast.Name) and node.id.endswith("algo")) or (
        isinstance(node, ast.Attribute) and node.attr == "algo") or (
        isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "algo")


def test_no_module_outside_the_registry_branches_on_an_algorithm_name():
    """`algo == "dqn"`, `cfg.training.algo != "ppo"`, `state["algo"] == ...` appear nowhere in
    mpippo/ but the registry: the entries' fields say what differs. (api.py's DQN function may
    recognize its learner's metrics by their algo: a call's result, not the run's setting.)"""
    found = []
    for path in sorted((ROOT / "mpippo").rglob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                sides = [node.left, *node.comparators]
                literal = any(isinstance(s, ast.Constant) and s.value in registry.NAMES for s in sides)
                if literal and any(_is_algo(s) for s in sides):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert found == []


@pytest.mark.parametrize("name", registry.NAMES)
def test_keys_an_algorithm_does_not_read_are_named_at_start_up(name):
    """Each key an entry says it ignores is a real key; set away from its default it is named in the
    warning line, with any setting of another algorithm's section; what the algorithm reads is not."""
    a, default = registry.get(name), C.Config()
    others = [s for s in registry.algorithm_sections() if s != a.section]
    fields = {s: {f.name for f in dataclasses.fields(getattr(default, s))} for s in ("training", *others)}
    base = [("training", "algo", name)]
    assert C.ignored_note(C.from_dict(C.merge_overrides({}, base), [])) is None
    for key in a.ignores:
        section, field = key.split(".")
        assert section == "training" and field in fields["training"], key
    changed = [(k.split(".")[0], k.split(".")[1], _another_value(getattr(default.training, k.split(".")[1])))
               for k in a.ignores]
    other = others[0]
    first = sorted(fields[other])[0]
    changed.append((other, first, _another_value(getattr(getattr(default, other), first))))
    changed.append(("training", "learning_rate", default.training.learning_rate / 2))  # read by every algorithm
    note = C.ignored_note(C.from_dict(C.merge_overrides({}, base + changed), []))
    assert note is not None and note.startswith(f"training.algo {name} does not read ")
    for section, field, _ in changed[:-1]:
        assert f"{section}.{field}=" in note, (section, field, note)
    assert "learning_rate" not in note


def _another_value(value):
    if isinstance(value, bool):
        return not value
    if value is None:
        return 0.01
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return value + [1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_no_shipped_config_sets_a_key_its_algorithm_does_not_read(path):
    cfg = C.from_dict(C.load_yaml(path), [])
    assert C.ignored_note(cfg) is None
