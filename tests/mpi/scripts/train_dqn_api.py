"""Under mpirun -n 3: the train_dqn() API with an episode budget and an episode-based learning budget."""
import json
import sys

from mpippo import train_dqn

out = train_dqn(n_episodes=300, num_workers=2, episodes_per_batch=4, learning_steps_per_batch=8, device="cpu",
                config="configs/dqn_toy.yaml", output_dir=sys.argv[1],
                overrides={"logging.tensorboard": False, "dqn.learning_starts": 200})
if out is not None:
    print(json.dumps(out), flush=True)
