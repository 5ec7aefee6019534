"""The shape of the code, checked: mpi4py and raw communicators only inside mpippo/comm/, and no
function in mpippo/ longer than a screen (80 lines)."""
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
    for p in sorted((ROOT / "mpippo").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == [], long
