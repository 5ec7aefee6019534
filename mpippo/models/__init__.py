"""The networks, and the one place that builds them from a config (`build`)."""
from mpippo.models.impala_cnn import DuelingQNetwork, ImpalaCNNPolicy
from mpippo.models.mlp import MLPPolicy, MLPQNetwork
from mpippo.models.nature_cnn import NatureCNNPolicy, NatureQNetwork

KINDS = ("actor_critic", "q")


def build(kind: str, obs_shape: tuple, num_actions: int, model, device=None, dueling: bool = True,
          continuous: bool = False):
    """The network of kind `kind` (an algorithm's registry entry names it) with the settings of
    `model` (the config's model section): for images (H, W, C) the IMPALA-CNN or (model.arch nature)
    the Nature CNN, its trunk drawn by model.init; for vectors (D,) the MLPs of model.mlp_sizes. actor_critic -> policy logits and a
    value (PPO, APPO, A2C); q -> Q-values (DQN; `dueling`: its head). continuous: a Gaussian policy
    over num_actions dimensions instead of logits (the MLP)."""
    if len(obs_shape) == 1:
        if kind == "q" and not continuous:
            net = MLPQNetwork(int(obs_shape[0]), num_actions, tuple(model.mlp_sizes), dueling)
        elif kind == "actor_critic":
            net = MLPPolicy(int(obs_shape[0]), num_actions, tuple(model.mlp_sizes), continuous)
        else:
            raise ValueError(f"network kind '{kind}' has no MLP for vector observations{' and continuous actions' if continuous else ''}")
        return net if device is None else net.to(device)
    if continuous:
        raise ValueError("continuous actions have a network for vector observations only (the MLP)")
    if kind == "q" and model.arch == "nature":
        net = NatureQNetwork(obs_shape, num_actions, model.hidden_size, dueling)
    elif kind == "actor_critic" and model.arch == "nature":
        net = NatureCNNPolicy(obs_shape, num_actions, model.hidden_size)
    elif kind == "q":
        net = DuelingQNetwork(obs_shape, num_actions, tuple(model.channels), model.hidden_size, dueling,
                              model.downsample)
    elif kind == "actor_critic":
        net = ImpalaCNNPolicy(obs_shape, num_actions, tuple(model.channels), model.hidden_size)
    else:
        raise ValueError(f"network kind '{kind}' is not one of {', '.join(KINDS)}")
    net.init_trunk_(model.init)
    return net if device is None else net.to(device)


def spec(obs_shape, num_actions: int, model, continuous: bool = False) -> dict:
    """What a checkpoint records of its network beyond the weights (`model_spec`): the spaces, and
    for vectors the dtype and the MLP's widths (ckpt_schema checks it; evaluate rebuilds from it)."""
    out = {"obs_shape": list(obs_shape), "num_actions": int(num_actions)}
    if len(obs_shape) == 1:  # (image runs' specs stay as checkpoints before vectors had them)
        out.update(obs_dtype="float32", mlp_sizes=list(model.mlp_sizes))
    if continuous:
        out["continuous"] = True
    return out


__all__ = ["DuelingQNetwork", "ImpalaCNNPolicy", "MLPPolicy", "MLPQNetwork", "NatureCNNPolicy", "NatureQNetwork",
           "build", "spec"]
