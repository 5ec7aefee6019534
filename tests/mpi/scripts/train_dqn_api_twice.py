"""Under mpirun -n 2: two train_dqn() calls in one process, as a notebook or a sweep script makes them.
Between them the caller's process is as it was: its Ctrl-C raises KeyboardInterrupt again (mpippo's
handlers had stayed, and the stop flag had ended the next call at start-up), and no lock is held on the
first run's folder (a second call, or run_mpi.py --resume, had been told it is in use)."""
import json
import os
import signal
import sys
import time

from mpippo import runlock, train_dqn

ARGS = dict(n_episodes=20, config="configs/dqn_toy.yaml", total_timesteps=2048,
            overrides={"dqn.learning_starts": 256, "logging.tensorboard": False})
out = {"first": train_dqn(output_dir=sys.argv[1], **ARGS) is not None}
out["handler_back"] = signal.getsignal(signal.SIGINT) is signal.default_int_handler
out["held"] = sorted(runlock._HELD)  # (the locks this process holds)
try:
    os.kill(os.getpid(), signal.SIGINT)  # the caller's own Ctrl-C, between two calls
    time.sleep(0.5)
    out["interrupted"] = False
except KeyboardInterrupt:
    out["interrupted"] = True
out["second"] = train_dqn(output_dir=sys.argv[2], **ARGS) is not None
print(json.dumps(out), flush=True)
