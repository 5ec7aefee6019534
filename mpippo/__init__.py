"""mpippo: MPI-native synchronous PPO and Ape-X DQN for Procgen."""
__version__ = "0.1.0"


def train_dqn(*args, **kwargs):
    """See mpippo.api.train_dqn (imported lazily: importing mpippo starts no MPI)."""
    from mpippo.api import train_dqn as _train_dqn  # here: `import mpippo` loads no trainer
    return _train_dqn(*args, **kwargs)


train_dqn.__doc__ = "Train Ape-X DQN on this MPI job's ranks; see mpippo.api.train_dqn."
