from mpippo.models.impala_cnn import DuelingQNetwork, ImpalaCNNPolicy

__all__ = ["DuelingQNetwork", "ImpalaCNNPolicy"]
