"""mpippo: MPI-native synchronous PPO for Procgen."""
__version__ = "0.1.0"
