"""PPO (Schulman et al. 2017) in the sync layout: the clipped surrogate loss and the registry's
algorithm object. The rollout, GAE and the minibatch update loop are the policy-gradient toolkit's
(algos/policy_gradient.py), which A2C shares with another loss.
"""
from __future__ import annotations

import torch

from mpippo import ckpt_schema as schema
from mpippo.algos.adam import Adam
from mpippo.algos.policy_gradient import PPOLoss, local_mean_std, minibatch_update
from mpippo.models.flat import num_params


def ppo_loss(newlogprob, entropy, newvalue, mb_logprobs, mb_advantages, mb_returns, mb_values,
             clip_range: float, clip_vloss: bool, ent_coef: float, vf_coef: float) -> PPOLoss:
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()  # k3 estimator, unbiased and >= 0
        clipfrac = ((ratio - 1.0).abs() > clip_range).float().mean()

    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_range)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    if clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -clip_range, clip_range)
        v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - mb_returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    return PPOLoss(loss, pg_loss, v_loss, entropy_loss, approx_kl, clipfrac)


def ppo_update(model, optimizer, batch: dict, cfg, grad_sync, *args, **kwargs) -> dict:
    """The toolkit's minibatch update with the clipped loss (PPO.update; the tests and the components bench)."""
    return minibatch_update(model, optimizer, batch, cfg, grad_sync, *args, loss_fn=ppo_loss, **kwargs)


class PPO:
    """PPO in the sync layout (registry entry "ppo"): what runners/sync.py asks of its algorithm.
    The runner owns the replicas, the rollout and the Allreduce (grad_sync); this owns the optimizer,
    the update and the check of what its checkpoints hold beside the runner's state."""

    def __init__(self, cfg):
        self.t = cfg.training
        self.gae_lambda = self.t.gae_lambda
        self.allreduces_per_iteration = self.t.n_epochs * self.t.num_minibatches  # gradient Allreduces

    def optimizer(self, params) -> Adam:
        return Adam(params, lr=self.t.learning_rate, eps=self.t.adam_eps)

    def update(self, model, optimizer, batch: dict, grad_sync, generator=None, timer=None, nonfinite_streak: int = 0,
               max_nonfinite_streak: int = 3, adv_moments=local_mean_std, shares=None) -> dict:
        return ppo_update(model, optimizer, batch, self.t, grad_sync, generator, timer, nonfinite_streak,
                          max_nonfinite_streak, adv_moments, shares=shares)

    @staticmethod
    def check_checkpoint(state: dict, cfg, net) -> None:
        """The sync layout's state and Adam over the one flat parameter (models/flat.py)."""
        schema.check_sync_state(state, cfg)
        schema.check_adam(state["optimizer"], "optimizer", [(num_params(net),)])
