"""mpippo: MPI-native synchronous PPO and Ape-X DQN for Procgen."""
import os as _os
import sys as _sys

__version__ = "0.1.0"


def _run_module() -> str:
    """The module `python -m` runs ('' otherwise). argv[0] is "-m" only while it is being found."""
    if _sys.argv[:1] != ["-m"]:
        return ""
    argv = getattr(_sys, "orig_argv", [])
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith("-m"):
            return arg[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
    return ""


def _imports_as_the_trainer() -> None:
    """`python -m mpippo.<tool>` puts the current folder first on sys.path, where a `yaml.py` in a run
    or shared folder would run in place of PyYAML: the folder goes. In a checkout it is replaced by the
    repository, which is what `python run_mpi.py` has first (a user's env module: PYTHONPATH, as for
    the trainer); an installed mpippo needs no entry. Only for mpippo's own modules: a user's
    `python -m theirs` that imports mpippo keeps its folder."""
    module = _run_module()
    if not (module == "mpippo" or module.startswith("mpippo.")) or getattr(_sys.flags, "safe_path", False) \
            or not _sys.path:
        return
    try:
        here = _os.getcwd()
    except OSError:  # (the folder was removed: nothing there to import either)
        return
    if _sys.path[0] in (here, ""):
        repo = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
        if _os.path.isfile(_os.path.join(repo, "run_mpi.py")):
            _sys.path[0] = repo
        else:  # (site-packages: already on the path, after the standard library)
            del _sys.path[0]


_imports_as_the_trainer()


def train_dqn(*args, **kwargs):
    """See mpippo.api.train_dqn (imported lazily: importing mpippo starts no MPI)."""
    from mpippo.api import train_dqn as _train_dqn  # here: `import mpippo` loads no trainer
    return _train_dqn(*args, **kwargs)


train_dqn.__doc__ = "Train Ape-X DQN on this MPI job's ranks; see mpippo.api.train_dqn."
