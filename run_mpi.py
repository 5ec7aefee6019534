#!/usr/bin/env python
"""Entry point: `mpirun -n K python run_mpi.py [options]` (or plain `python run_mpi.py`)."""
import gc

# No cyclic collection during start-up: its passes over what torch's import makes find next to nothing
# (mpippo/runctl.py, end_startup_gc_pause, turns it on once the trainer is built).
gc.disable()

# First, before anything slow: a preemption signal during start-up is a flag, not a kill.
from mpippo import preemption  # noqa: E402

preemption.install()

from mpippo.errors import console_lost, let_readers_leave, say  # noqa: E402

let_readers_leave(progress_only=True)  # (`run_mpi.py | head`, `> log` on a full disk: the run goes on; `>&-`: /dev/null)
preemption.log_signals()  # (the hang watch reads them: a main thread in native code may never)

from mpippo import hostmem  # noqa: E402

# Before torch allocates: keep freed memory mapped (page faults were 10-40% of a training
# step; mpippo/hostmem.py and README, Performance).
hostmem.configure()

from mpippo.cli import main  # noqa: E402

if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as e:  # (start-up's refusals, a stop after a signal; --help)
        code = e.code
        if code in (0, None) and (lost := console_lost("its help is lost")):  # (--help into a full disk)
            say(f"mpippo: error: {lost}")
            code = 1
    finally:  # decided (start-up exits too): a late signal cannot change the exit code in MPI's shutdown
        preemption.settle()
    from mpippo.shutdown import end_process
    end_process(code)  # (without the interpreter's teardown: mpippo/shutdown.py says why)
