"""mpippo: MPI-native synchronous PPO and Ape-X DQN for Procgen."""
import os as _os
import sys as _sys

__version__ = "0.1.0"


def _imports_as_the_trainer() -> None:
    """`python -m mpippo.<tool>` puts the current folder first on sys.path, where a `yaml.py` in a run
    or shared folder would run in place of PyYAML: the folder is replaced by the one that holds mpippo,
    which is what `python run_mpi.py` has first (a user's env module: PYTHONPATH, as for the trainer).
    argv[0] is "-m" only while the module is being found, which is when this package is imported."""
    if _sys.argv[:1] != ["-m"] or _sys.flags.safe_path or not _sys.path:
        return
    try:
        here = _os.getcwd()
    except OSError:  # (the folder was removed: nothing there to import either)
        return
    if _sys.path[0] in (here, ""):
        _sys.path[0] = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))


_imports_as_the_trainer()


def train_dqn(*args, **kwargs):
    """See mpippo.api.train_dqn (imported lazily: importing mpippo starts no MPI)."""
    from mpippo.api import train_dqn as _train_dqn  # here: `import mpippo` loads no trainer
    return _train_dqn(*args, **kwargs)


train_dqn.__doc__ = "Train Ape-X DQN on this MPI job's ranks; see mpippo.api.train_dqn."
