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

The top of this module (the a2c section and the registry entry) is read by mpippo.config before
torch loads, so torch is imported inside the functions that run the algorithm.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mpippo.algos.registry import SYNC, Algorithm, setting

OPTIMIZERS = ("rmsprop", "adam")
RETURNS = ("nstep", "gae")


@dataclass
class A2CConfig:
    optimizer: str = setting("rmsprop", "A2C: rmsprop (as SB3 and the A3C paper; alpha and eps below) | adam "
                                        "(training.adam_eps), both at training.learning_rate.")
    rmsprop_alpha: float = setting(0.99, "A2C: RMSprop's smoothing constant of the squared gradients, in [0, 1).")
    rmsprop_eps: float = setting(1e-5, "A2C: RMSprop's epsilon (added to the root of the squared-gradient average).")
    returns: str = setting("nstep", "A2C: nstep (bootstrapped returns over the rollout: GAE with lambda 1, SB3's "
                                    "default) | gae (GAE with training.gae_lambda).")
    num_minibatches: int = setting(1, "A2C: gradient steps in the one pass over each rollout (global, as "
                                      "training.num_minibatches); 1 = one step on the whole batch.")


def check(cfg, world_size: int, earlier: list[str]) -> list[str]:
    """The a2c section's choices and ranges, then the sync layout's minibatch split (one line each)."""
    from mpippo import config as C
    a, errs = cfg.a2c, []
    for key, allowed in (("optimizer", OPTIMIZERS), ("returns", RETURNS)):
        if getattr(a, key) not in allowed:
            errs.append(f"a2c.{key}: {C.show(getattr(a, key))} is not one of {', '.join(allowed)}")
    if not 0 <= a.rmsprop_alpha < 1:
        errs.append(f"a2c.rmsprop_alpha: must be in [0, 1), got {a.rmsprop_alpha}")
    if not a.rmsprop_eps > 0:
        errs.append(f"a2c.rmsprop_eps: must be > 0, got {a.rmsprop_eps}")
    errs += C._within("a2c", a, {"num_minibatches": (1, None)})
    return errs + C.check_sync(cfg, world_size, earlier + errs)


ALGORITHM = Algorithm(
    "a2c", SYNC, "a2c (synchronous advantage actor-critic: PPO's layout, one pass per rollout, no clipping; "
    "section a2c)", impl=lambda: A2C, check=check, section="a2c", section_type=A2CConfig,  # (A2C: below)
    logs=("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance"), minibatches_key="a2c.num_minibatches",
    continuous=True,
    ignores=("training.n_epochs", "training.num_minibatches", "training.clip_range", "training.clip_vloss",
             "training.target_kl"))


# ---- the algorithm (torch) ----
def a2c_loss(newlogprob, entropy, newvalue, mb_logprobs, mb_advantages, mb_returns, mb_values,
             clip_range: float, clip_vloss: bool, ent_coef: float, vf_coef: float):
    """The actor-critic loss of one minibatch, in ppo_loss's signature (the toolkit's minibatch_update calls it; PPO's
    clip_range and clip_vloss are unused). approx_kl measures how far the policy moved from the
    rollout's within the pass (0 at its first step), so it reads as PPO's does; clipfrac is 0."""
    from mpippo.algos.policy_gradient import PPOLoss
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
    import torch
    from torch.optim.rmsprop import rmsprop

    from mpippo.algos.adam import Adam

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
            from mpippo.algos.adam import Adam
            return Adam(params, lr=self.t.learning_rate, eps=self.t.adam_eps)
        return make_rmsprop(params, self.t.learning_rate, self.a.rmsprop_alpha, self.a.rmsprop_eps)

    def update(self, model, optimizer, batch: dict, grad_sync, generator=None, timer=None, nonfinite_streak: int = 0,
               max_nonfinite_streak: int = 3, adv_moments=None, shares=None) -> dict:
        from mpippo.algos.policy_gradient import local_mean_std, minibatch_update
        # one pass in a2c.num_minibatches steps; no KL stop (built here: training.precision is settled by the runner)
        one_pass = dataclasses.replace(self.t, n_epochs=1, num_minibatches=self.a.num_minibatches, target_kl=None)
        return minibatch_update(model, optimizer, batch, one_pass, grad_sync, generator, timer, nonfinite_streak,
                                max_nonfinite_streak, adv_moments or local_mean_std, loss_fn=a2c_loss, shares=shares)

    @staticmethod
    def check_checkpoint(state: dict, cfg, net) -> None:
        """The sync layout's state and the optimizer over the one flat parameter (models/flat.py)."""
        from mpippo import ckpt_schema as schema
        from mpippo.algos.adam import Adam
        from mpippo.models.flat import num_params
        schema.check_sync_state(state, cfg)
        moments = Adam.MOMENTS if cfg.a2c.optimizer == "adam" else ("square_avg",)
        schema.check_optimizer(state["optimizer"], "optimizer", [(num_params(net),)], moments)
