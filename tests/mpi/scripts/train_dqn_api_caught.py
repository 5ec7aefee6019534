"""Under mpirun -n 2 with MPIPPO_FAULT raising on the actor: the caller's script catches the exception, as a
notebook or a sweep does. The job still ends at once (fail-stop): the learner had waited for its actor until
the watchdog (10 minutes by default), then MPI killed it."""
import sys

from mpippo import train_dqn

try:
    train_dqn(n_episodes=10**6, config="configs/dqn_toy.yaml", total_timesteps=10**6, output_dir=sys.argv[1],
              overrides={"dqn.learning_starts": 256, "logging.tensorboard": False})
except Exception as e:  # noqa: BLE001 (what a caller's script does)
    print(f"caught {type(e).__name__}", flush=True)
print("the script went on", flush=True)
