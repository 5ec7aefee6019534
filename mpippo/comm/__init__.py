"""The only package that imports mpi4py. Everything else gets a `World` passed in."""
from mpippo.comm.world import World, mpi_library

__all__ = ["World", "mpi_library"]
