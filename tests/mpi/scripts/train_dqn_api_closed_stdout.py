"""Under mpirun -n 2: train_dqn() called with the script's sys.stdout closed (a closed StringIO), as a
notebook's redirected output can be. The call trains and returns; its lines go nowhere."""
import io
import json
import sys

from mpippo import train_dqn

closed = io.StringIO()
closed.close()
sys.stdout = closed
out = train_dqn(n_episodes=20, config="configs/dqn_toy.yaml", total_timesteps=2048, output_dir=sys.argv[1],
                overrides={"dqn.learning_starts": 256, "logging.tensorboard": False})
sys.__stdout__.write(json.dumps({"learner": out is not None, "stdout_still_closed": sys.stdout is closed}) + "\n")
sys.__stdout__.flush()
