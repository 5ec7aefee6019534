from mpippo.models.impala_cnn import ImpalaCNNPolicy

__all__ = ["ImpalaCNNPolicy"]
