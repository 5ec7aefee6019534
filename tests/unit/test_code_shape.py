"""The shape of the code, checked: mpi4py and raw communicators only inside mpippo/comm/, no
function in mpippo/, benchmarks/ or analysis/ longer than a screen (80 lines), no import circle."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# methods of an mpi4py communicator, request or the MPI module that nothing outside comm/ may call
# (lowercase gather/allgather are also World's and torch's; `.comm` catches a raw communicator anyway)
MPI_METHODS = {"Send", "Recv", "Isend", "Irecv", "Bcast", "bcast", "Allreduce", "allreduce", "Reduce",
               "Gather", "Allgather", "Scatter", "Alltoall", "Split", "Split_type",
               "Barrier", "Abort", "Get_rank", "Get_size", "Dup", "Free", "Testsome", "Testall", "Waitall",
               "Iprobe", "Probe", "COMM_WORLD", "Get_library_version", "Translate_ranks"}


def python_files():
    for folder in ("mpippo", "benchmarks", "analysis"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "comm" not in p.relative_to(ROOT).parts[1:2]:
                yield p
    yield ROOT / "run_mpi.py"


def mpi_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "mpi4py"]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if mod.split(".")[0] == "mpi4py" or any(a.name == "MPI" for a in node.names):
                found.append(f"from {mod} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Attribute) and (node.attr in MPI_METHODS or node.attr == "comm"):
            found.append(f".{node.attr} (line {node.lineno})")
    return found


def test_mpi_only_inside_mpippo_comm():
    offenders = {str(p.relative_to(ROOT)): u for p in python_files() if (u := mpi_uses(p))}
    assert offenders == {}, offenders


def test_the_boundary_check_sees_what_it_must(tmp_path):
    """The walker itself: each kind of use is found."""
    probe = tmp_path / "probe.py"
    probe.write_text("from mpi4py import MPI\nimport mpi4py.MPI\nfrom mpippo.comm.world import MPI as M\n"
                     "world.comm.Split(1, 2)\nx.Isend(b, dest=1)\n")
    uses = mpi_uses(probe)
    assert len(uses) == 6, uses


def test_no_function_longer_than_a_screen():
    long = []
    for p in sorted(q for folder in ("mpippo", "benchmarks", "analysis") for q in (ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == [], long


def import_graph(package: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, every import counted (at the top or inside a
    function: a lazy import hides a circle from the interpreter, not from a reader). `from pkg
    import sub` is an import of the submodule only."""
    mods = {}
    for p in package.rglob("*.py"):
        name = ".".join(p.relative_to(package.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    graph[m].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_and_envs_import_nothing_above_them():
    graph = import_graph(ROOT / "mpippo")
    assert circles(graph) == []
    # usage: the one-line error, a leaf (argparse only); errors: the failure classes, a leaf (no imports)
    below = ("mpippo.envs", "mpippo.usage", "mpippo.errors")
    upward = {m: sorted(t for t in ts if not t.startswith(below)) for m, ts in graph.items()
              if m.startswith("mpippo.envs") and any(not t.startswith(below) for t in ts)}
    assert upward == {}  # the envs are the bottom layer: config and the rest import them


def test_the_circle_finder_finds_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")  # hidden in a function: still a circle
    (pkg / "c.py").write_text("import pkg.a\n")
    assert circles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


def test_bad_input_is_refused_before_torch_loads():
    """The trainer's and the tools' checks (phases A-C of mpippo/cli.py, toolcli.check_trainer) run
    before torch is imported: it costs 1-3 s of CPU per process, paid by every refused rank and tool
    otherwise (the hostile tables start hundreds of them). Importing torch early must be a choice."""
    import subprocess
    import sys
    probe = ("import sys\nimport mpippo.cli, mpippo.toolcli, mpippo.launch, mpippo.suite.spec, mpippo.config\n"
             "print(sorted(m for m in ('torch', 'procgen', 'gym3', 'tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# packages whose import costs start-up time or may be absent: an import inside a function keeps them
# out of the processes that do not need them (a refused config never loads torch)
HEAVY_OR_OPTIONAL = {"torch", "numpy", "matplotlib", "ale_py", "gymnasium", "tensorboard", "rliable", "mujoco",
                     "pettingzoo", "procgen", "gym3", "imageio", "tqdm", "wandb", "psutil", "yaml", "mpi4py"}


def lazy_imports_without_reason(package: Path) -> list[str]:
    """Imports inside functions of anything but HEAVY_OR_OPTIONAL with no comment on their line (or
    the line above) saying why they are not at the top."""
    found = []
    for p in sorted(package.rglob("*.py")):
        src = p.read_text()
        lines = src.splitlines()
        for fn in ast.walk(ast.parse(src)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
                    if (mod or "").split(".")[0] not in HEAVY_OR_OPTIONAL and not said:
                        found.append(f"{p.relative_to(package.parent)}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return sorted(set(found))


def test_an_import_inside_a_function_says_why():
    assert lazy_imports_without_reason(ROOT / "mpippo") == []


def test_the_lazy_import_check_sees_a_bare_one(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    import json\n    import torch\n    from pkg import b  # why: b is slow\n")
    assert lazy_imports_without_reason(pkg) == ["pkg/a.py:2 import json"]
