"""A2C: synchronous advantage actor-critic (Mnih et al. 2016, A3C's synchronous form, as in
Stable-Baselines3 and RLlib), in the sync layout: the runner's replicas and its one Allreduce of
the flat gradient per minibatch (runners/sync.py), PPO's network and rollout.

One iteration on each rank:
  rollout of training.n_steps per env -> returns and advantages: bootstrapped n-step returns
  (a2c.returns: nstep, GAE with lambda 1, SB3's default) or GAE with training.gae_lambda ->
  one pass over the rollout in a2c.num_minibatches gradient steps (1: the whole batch in one step),
  each [backward -> 1 Allreduce of the flat gradient -> clip to max_grad_norm -> RMSprop or Adam].
No probability ratio and no clipping: the loss is
  pg_loss - ent_coef * entropy + vf_coef * v_loss,  pg_loss = -mean(A * log pi(a|s)),
  v_loss = 0.5 * mean((V(s) - R)^2).
From the training section it reads n_steps, learning_rate, anneal_lr, gamma, gae_lambda (with
returns: gae), ent_coef, vf_coef, max_grad_norm, norm_adv/adv_norm, normalize_reward/reward_norm
and, with optimizer: adam, adam_eps; PPO's n_epochs, num_minibatches, clip_range, clip_vloss and
target_kl do not apply.

Its registry entry, section and checks are in algos/a2c_settings.py (read by the config before torch
loads).
"""
from __future__ import annotations

import dataclasses

import torch
from torch.optim.rmsprop import rmsprop

from mpippo import ckpt_schema as schema
from mpippo.algos.adam import Adam
from mpippo.algos.policy_gradient import PPOLoss, local_mean_std, minibatch_update
from mpippo.models.flat import num_params


def a2c_loss(newlogprob, entropy, newvalue, mb_logprobs, mb_advantages, mb_returns, mb_values,
             clip_range: float, clip_vloss: bool, ent_coef: float, vf_coef: float):
    """The actor-critic loss of one minibatch, in ppo_loss's signature (the toolkit's minibatch_update calls it; PPO's
    clip_range and clip_vloss are unused). approx_kl measures how far the policy moved from the
    rollout's within the pass (0 at its first step), so it reads as PPO's does; clipfrac is 0."""
    pg_loss = -(mb_advantages * newlogprob).mean()
    v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    entropy_loss = entropy.mean()
    logratio = (newlogprob - mb_logprobs).detach()
    approx_kl = ((logratio.exp() - 1) - logratio).mean()
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    return PPOLoss(loss, pg_loss, v_loss, entropy_loss, approx_kl, approx_kl.new_zeros(()))


def make_rmsprop(params, lr: float, alpha: float, eps: float):
    """torch.optim.RMSprop's arithmetic (its functional `rmsprop`: square_avg = alpha * square_avg +
    (1 - alpha) * g^2, p -= lr * g / (sqrt(square_avg) + eps)) with algos/adam.py's bookkeeping: one
    group, torch.optim's state_dict layout, no import of torch's compiler stack."""
    class RMSprop(Adam):
        MOMENTS = ("square_avg",)

        def __init__(self):
            group = dict(lr=lr, momentum=0, alpha=alpha, eps=eps, centered=False, weight_decay=0, capturable=False,
                         foreach=None, maximize=False, differentiable=False)
            self.param_groups = [{**group, "params": list(params)}]
            self.state = {}

        @torch.no_grad()
        def step(self) -> None:
            g = self.param_groups[0]
            ps = [p for p in self.params if p.grad is not None]
            states = [self._moments(p) for p in ps]
            rmsprop(ps, [p.grad for p in ps], [s["square_avg"] for s in states], [], [], [s["step"] for s in states],
                    foreach=g["foreach"], maximize=False, differentiable=False, capturable=False,
                    has_complex=any(torch.is_complex(p) for p in ps), lr=g["lr"], alpha=g["alpha"], eps=g["eps"],
                    weight_decay=0, momentum=0, centered=False)

    return RMSprop()


class A2C:
    """A2C in the sync layout (registry entry "a2c"): what runners/sync.py asks of its algorithm.
    The update is ppo_update's minibatch loop (advantage normalization, the Allreduce through
    grad_sync, the non-finite guard, gradient clipping) run once, with the A2C loss."""

    def __init__(self, cfg):
        self.t, self.a = cfg.training, cfg.a2c
        self.gae_lambda = 1.0 if self.a.returns == "nstep" else self.t.gae_lambda
        self.allreduces_per_iteration = self.a.num_minibatches  # one gradient Allreduce per step

    def optimizer(self, params):
        if self.a.optimizer == "adam":
            return Adam(params, lr=self.t.learning_rate, eps=self.t.adam_eps)
        return make_rmsprop(params, self.t.learning_rate, self.a.rmsprop_alpha, self.a.rmsprop_eps)

    def update(self, model, optimizer, batch: dict, grad_sync, generator=None, timer=None, nonfinite_streak: int = 0,
               max_nonfinite_streak: int = 3, adv_moments=None, shares=None) -> dict:
        # one pass in a2c.num_minibatches steps; no KL stop (built here: training.precision is settled by the runner)
        one_pass = dataclasses.replace(self.t, n_epochs=1, num_minibatches=self.a.num_minibatches, target_kl=None)
        return minibatch_update(model, optimizer, batch, one_pass, grad_sync, generator, timer, nonfinite_streak,
                                max_nonfinite_streak, adv_moments or local_mean_std, loss_fn=a2c_loss, shares=shares)

    @staticmethod
    def check_checkpoint(state: dict, cfg, net) -> None:
        """The sync layout's state and the optimizer over the one flat parameter (models/flat.py)."""
        schema.check_sync_state(state, cfg)
        moments = Adam.MOMENTS if cfg.a2c.optimizer == "adam" else ("square_avg",)
        schema.check_optimizer(state["optimizer"], "optimizer", [(num_params(net),)], moments)
