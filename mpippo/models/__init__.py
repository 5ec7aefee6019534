"""The networks, and the one place that builds them from a config (`build`)."""
from mpippo.models.impala_cnn import DuelingQNetwork, ImpalaCNNPolicy
from mpippo.models.mlp import MLPPolicy

KINDS = ("actor_critic", "q")


def build(kind: str, obs_shape: tuple, num_actions: int, model, device=None, dueling: bool = True,
          continuous: bool = False):
    """The network of kind `kind` (an algorithm's registry entry names it) with the settings of
    `model` (the config's model section): for images (H, W, C) the IMPALA-CNN, its trunk drawn by
    model.init; for vectors (D,) the MLP of model.mlp_sizes. actor_critic -> policy logits and a
    value (PPO, APPO, A2C); q -> Q-values (DQN; `dueling`: its head). continuous: a Gaussian policy
    over num_actions dimensions instead of logits (the MLP)."""
    if len(obs_shape) == 1:
        if kind != "actor_critic":
            raise ValueError(f"network kind '{kind}' has no MLP for vector observations (actor_critic has)")
        net = MLPPolicy(int(obs_shape[0]), num_actions, tuple(model.mlp_sizes), continuous)
        return net if device is None else net.to(device)
    if continuous:
        raise ValueError("continuous actions have a network for vector observations only (the MLP)")
    if kind == "q":
        net = DuelingQNetwork(obs_shape, num_actions, tuple(model.channels), model.hidden_size, dueling,
                              model.downsample)
    elif kind == "actor_critic":
        net = ImpalaCNNPolicy(obs_shape, num_actions, tuple(model.channels), model.hidden_size)
    else:
        raise ValueError(f"network kind '{kind}' is not one of {', '.join(KINDS)}")
    net.init_trunk_(model.init)
    return net if device is None else net.to(device)


__all__ = ["DuelingQNetwork", "ImpalaCNNPolicy", "MLPPolicy", "build"]
