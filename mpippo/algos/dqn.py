"""DQN pieces for the Ape-X layout, pure numpy/torch (no MPI): prioritized replay held and
sampled on the learner's device, n-step returns computed on the actors, the Ape-X epsilon
ladder, and the double-DQN loss with importance weights.

Transition layout everywhere: obs (uint8 HWC images or float32 vectors: envs.obs_dtype), action,
n-step return R, discount (gamma^n; gamma^k when a time limit cut the episode after k steps, next_obs
then its final observation; 0 when it terminated inside the n steps), next_obs (obs n steps later).
Target: R + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a)).
"""
from __future__ import annotations

import math
import zipfile

import numpy as np
import torch
import torch.nn.functional as F

from mpippo.envs import bits_to_mask, mask_bits, obs_dtype
from mpippo.files import NotAFile, open_regular


def apex_epsilons(n: int, eps: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X: explorer i of n (an env: the paper's actors stepped one each) uses eps ** (1 + alpha * i / (n - 1));
    a lone one gets eps."""
    if n == 1:
        return np.array([eps])
    i = np.arange(n)
    return eps ** (1.0 + alpha * i / (n - 1))


GiB = 1 << 30


def torch_obs_dtype(obs_shape) -> torch.dtype:
    return getattr(torch, obs_dtype(obs_shape))  # ("uint8" and "float32" are torch's names too)


def replay_device(learner_device, nbytes: int, reserve_fraction: float = 0.2, reserve_min: int = 4 * GiB) -> torch.device:
    """Where a replay of `nbytes` keeps its storage: on the learner's GPU when it fits in the GPU's free
    memory with room to spare (a fifth of the GPU, at least 4 GiB, for the networks, their activations
    and the allocator's slack), else on the host (a CPU learner: always the host)."""
    dev = torch.device(learner_device)
    if dev.type != "cuda":
        return torch.device("cpu")
    free, total = torch.cuda.mem_get_info(dev)
    return dev if nbytes + max(reserve_min, reserve_fraction * total) <= free else torch.device("cpu")


def write_npz(f, arrays: dict, chunk_bytes: int = 64 << 20) -> None:
    """np.savez's file (a zip of uncompressed .npy members, readable by np.load with allow_pickle=False),
    written member by member in chunks of at most `chunk_bytes`: a tensor on a GPU is copied to the host a
    chunk at a time, never whole. Values: numpy arrays, numpy scalars or torch tensors."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, value in arrays.items():
            if isinstance(value, torch.Tensor):
                value = value.detach()
                dtype = torch.empty(0, dtype=value.dtype).numpy().dtype
            else:
                value = np.asarray(value)
                dtype = value.dtype
            shape = tuple(value.shape)
            header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
            with z.open(name + ".npy", "w", force_zip64=True) as out:
                if len(repr(header)) > 60000:  # format 1.0 holds headers below 64 KiB
                    np.lib.format.write_array_header_2_0(out, header)
                else:
                    np.lib.format.write_array_header_1_0(out, header)
                if not shape or not shape[0]:
                    out.write(np.ascontiguousarray(value.cpu().numpy() if isinstance(value, torch.Tensor) else value)
                              .tobytes())
                    continue
                row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize)
                step = max(1, chunk_bytes // row)
                for i in range(0, shape[0], step):
                    part = value[i:i + step]
                    part = part.cpu().numpy() if isinstance(part, torch.Tensor) else part
                    out.write(memoryview(np.ascontiguousarray(part)).cast("B"))


class PrioritizedReplay:
    """Proportional prioritized replay (Schaul et al. 2016) over observations (uint8 frames or float32
    vectors, by their shape: envs.obs_dtype), stored as torch tensors
    on one device (`device`: the learner's GPU when the buffer fits there, see replay_device; else the
    host), and sampled there by torch ops: nothing of a sample or of a priority update passes through
    the host when the storage is on the learner's device. A host buffer feeding a GPU gathers each
    batch into pinned memory and copies it over without waiting (its storage stays pageable, numpy's
    lazily mapped zeros: pinning tens of GB buys nothing the pinned batch does not).

    Slot i holds a transition and `prio[i]` = priority ** alpha (float64; 0 for an empty slot). New
    transitions get the largest priority seen so far (`max_priority`, a 0-d device tensor), or their own.
    sample() is stratified as before: the total mass is cut into batch_size equal strata and one point
    drawn uniformly in each (the device generator `generator`), each point selects the slot whose
    interval of the cumulative sum of `prio` holds it (one cumsum, in integer units of the total so
    that a GPU draws the same as itself, and one binary search per sample: the work of a sum tree's
    descent without its sequential levels); importance weights
    (size * P(i)) ** -beta normalized by their max. update_priorities() writes (|td| + eps) ** alpha,
    optionally only where a device flag allows (a skipped learner step), and raises max_priority.
    The buffer is saved to and loaded from an .npz file (allow_pickle=False) as before."""

    def __init__(self, capacity: int, obs_shape, alpha: float = 0.6, eps: float = 1e-6, seed: int = 0,
                 device=None, legal_words: int = 1):
        self.capacity, self.alpha, self.eps = capacity, alpha, eps
        self.device = torch.device(device if device is not None else "cpu")
        shape, dtype = (capacity,) + tuple(obs_shape), torch_obs_dtype(obs_shape)
        self.obs = self._zeros(shape, dtype)
        self.next_obs = self._zeros(shape, dtype)
        self.actions = self._zeros((capacity,), torch.int64)
        self.returns = self._zeros((capacity,), torch.float32)
        self.discounts = self._zeros((capacity,), torch.float32)
        self.next_legal = self._zeros((capacity, legal_words), torch.int64)  # next_obs's legal actions (mask_bits); -1: all
        self.next_legal.fill_(-1)
        self.prio = self._zeros((capacity,), torch.float64)  # priority ** alpha per slot
        self.max_priority = torch.ones((), dtype=torch.float64, device=self.device)
        self.size = self.pos = 0
        self.rng = np.random.default_rng(seed)  # seeds the device generator (and reseeds it: reseed())
        self.generator = torch.Generator(device=self.device)
        self.reseed()

    def _zeros(self, shape, dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            # numpy's zeros: pages the OS maps on first write, as the buffer fills (torch.zeros writes them all now)
            return torch.from_numpy(np.zeros(shape, dtype=torch.empty(0, dtype=dtype).numpy().dtype))
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def reseed(self) -> None:
        """Seed the device generator from `rng` (at construction, and on loading a checkpoint that has no
        generator state of this device: the draws then follow from the checkpoint's numpy state)."""
        self.generator.manual_seed(int(self.rng.integers(2**63 - 1)))

    @staticmethod
    def nbytes(capacity: int, obs_shape, legal_words: int = 1) -> int:
        """Memory the buffer will take (an upper bound), to check before allocating."""
        frame = int(np.prod(obs_shape)) * np.dtype(obs_dtype(obs_shape)).itemsize
        return capacity * (2 * frame + 8 + 4 + 4 + 8 * legal_words) + 2 * (1 << max(int(capacity - 1).bit_length(), 0)) * 8

    def _rows(self, dst: torch.Tensor, src, start: int, first: int) -> None:
        """Copy the n rows of `src` into the ring at `start` (`first` of them before the end, the rest from 0)."""
        if not isinstance(src, torch.Tensor):
            src = torch.from_numpy(np.ascontiguousarray(src))
        if src.shape[1:] != dst.shape[1:]:  # (copy_ would broadcast: a transition's legal moves in another width)
            raise ValueError(f"rows of shape {tuple(src.shape[1:])} for a buffer of {tuple(dst.shape[1:])}")
        n = src.shape[0]
        dst[start:start + first].copy_(src[:first], non_blocking=True)
        if n > first:
            dst[:n - first].copy_(src[first:], non_blocking=True)

    def add(self, obs, actions, returns, discounts, next_obs, priorities=None, next_legal=None) -> None:
        """Store n transitions (numpy arrays or tensors; copied before returning: the caller may reuse its
        buffers) at the write position, overwriting the oldest once full."""
        n = len(actions)
        if n == 0:
            return
        skip = max(n - self.capacity, 0)  # more than the buffer holds: only the last `capacity` stay
        start = (self.pos + skip) % self.capacity
        keep = n - skip
        first = min(keep, self.capacity - start)
        for dst, src in ((self.obs, obs), (self.next_obs, next_obs), (self.actions, actions),
                         (self.returns, returns), (self.discounts, discounts)):
            self._rows(dst, src[skip:], start, first)
        if next_legal is None:
            self.next_legal[start:start + first].fill_(-1)
            self.next_legal[:keep - first].fill_(-1)
        else:
            self._rows(self.next_legal, next_legal[skip:], start, first)
        if priorities is None:
            p = self.max_priority ** self.alpha
            self.prio[start:start + first].fill_(p)
            self.prio[:keep - first].fill_(p)
        else:
            p = torch.as_tensor(np.asarray(priorities, dtype=np.float64)[skip:] if not isinstance(priorities, torch.Tensor)
                                else priorities[skip:]).to(self.device, torch.float64).abs() + self.eps
            self.max_priority = torch.maximum(self.max_priority, p.max())
            self._rows(self.prio, p ** self.alpha, start, first)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, beta: float, device=None):
        """Stratified proportional sample -> (indices, batch dict, importance weights normalized to max 1),
        all tensors. The batch is on `device` (default: the storage's); `frames` holds obs then next_obs,
        (2 x batch_size, H, W, C), and `obs` and `next_obs` are its halves. Indices stay on the storage's
        device (for update_priorities), the weights (float32) go with the batch."""
        n, dev = self.size, self.device
        out = torch.device(device) if device is not None else dev
        prio = self.prio[:n]
        total = prio.sum()
        # the cumulative sum in integers (units of 2**-62 of the total): a float cumsum on a GPU is not
        # deterministic (CUB's scan), an integer one is; a slot below 2**-62 of the mass is never drawn
        cdf = torch.cumsum((prio * (2.0**62 / total)).long(), 0)
        units = cdf[-1]
        u = torch.rand(batch_size, generator=self.generator, device=dev, dtype=torch.float64)
        mass = ((torch.arange(batch_size, device=dev, dtype=torch.float64) + u) * (units.double() / batch_size)).long()
        idx = torch.searchsorted(cdf, torch.minimum(mass, units - 1), right=True).clamp_(max=n - 1)
        weights = (n * (prio[idx] / total)) ** (-beta)
        weights = (weights / weights.max()).float()
        staged = out != dev and dev.type == "cpu" and out.type == "cuda"  # a host buffer feeding a GPU learner
        frames = torch.empty((2 * batch_size,) + tuple(self.obs.shape[1:]), dtype=self.obs.dtype, device=dev,
                             pin_memory=staged and torch.cuda.is_available())
        torch.index_select(self.obs, 0, idx, out=frames[:batch_size])
        torch.index_select(self.next_obs, 0, idx, out=frames[batch_size:])
        batch = {"frames": frames, "actions": self.actions[idx], "returns": self.returns[idx],
                 "discounts": self.discounts[idx], "next_legal": self.next_legal[idx]}
        if out != dev:
            batch = {k: v.to(out, non_blocking=True) for k, v in batch.items()}
            weights = weights.to(out, non_blocking=True)
        batch["obs"], batch["next_obs"] = batch["frames"][:batch_size], batch["frames"][batch_size:]
        return idx, batch, weights

    def update_priorities(self, idx, td_errors, ok=None) -> None:
        """New priorities (|td| + eps) ** alpha of the sampled slots `idx` (tensors or arrays; a slot drawn
        twice keeps the larger). `ok`: a bool tensor; where it is false (a skipped learner step) nothing
        changes, decided on the device. max_priority rises to the largest new priority."""
        idx = torch.as_tensor(idx).to(self.device, torch.int64)
        p = torch.as_tensor(td_errors).to(self.device, torch.float64).abs() + self.eps
        new, top = p ** self.alpha, torch.maximum(self.max_priority, p.max())
        if ok is not None:
            ok = torch.as_tensor(ok).to(self.device)
            new = torch.where(ok, new, self.prio[idx])
            top = torch.where(ok, top, self.max_priority)
        self.prio.scatter_reduce_(0, idx, new, reduce="amax", include_self=False)
        self.max_priority = top

    def save(self, f, tag: int) -> None:
        """Write the stored transitions, their priorities and the write position to the open binary
        file `f` (npz, uncompressed; from a GPU a chunk at a time); `tag` names the checkpoint this file
        belongs to."""
        n = self.size  # until the buffer wraps, the first `size` slots are the stored ones
        write_npz(f, {"tag": np.int64(tag), "capacity": np.int64(self.capacity), "pos": np.int64(self.pos),
                      "size": np.int64(n), "max_priority": np.float64(float(self.max_priority)),
                      "leaves": self.prio[:n], "obs": self.obs[:n], "next_obs": self.next_obs[:n],
                      "actions": self.actions[:n], "returns": self.returns[:n], "discounts": self.discounts[:n],
                      "next_legal": self.next_legal[:n]})

    def _bad_values(self, n: int, top: int, max_priority: float) -> str | None:
        """What the file just copied in holds that save() never writes, or None: checked in the buffer,
        so that no array of the file is read twice."""
        actions, parts = self.actions[:n], {"returns": self.returns[:n], "discounts": self.discounts[:n],
                                            "leaves": self.prio[:n]}
        if self.obs.dtype.is_floating_point:  # (images are uint8: every value is one save() may write)
            parts.update(obs=self.obs[:n], next_obs=self.next_obs[:n])
        if n and (int(actions.min()) < 0 or int(actions.max()) >= top):
            return f"its actions are not integers 0 to {top - 1}"
        for name, part in parts.items():
            if not bool(torch.isfinite(part).all()):
                return f"its {name} holds a value that is not finite"
        if not math.isfinite(max_priority):
            return "its max_priority holds a value that is not finite"
        if n and not 0 < float(parts["leaves"].sum()) < math.inf:  # (sampling takes their cumulative sum: 1e308 each overflows)
            return "its priorities do not sum to a finite positive number"
        if bool((parts["discounts"] < 0).any() | (parts["discounts"] > 1).any() | (parts["leaves"] < 0).any()) \
                or max_priority <= 0:
            return "its discounts lie outside [0, 1] or its priorities are not positive"
        return None

    def _bad_legal(self, n: int, num_actions: int | None) -> str | None:
        """Legal moves save() never writes: a state with none (the target's argmax over nothing), or moves past
        the game's; rows of -1 words (all legal) aside."""
        legal = self.next_legal[:n]
        if not n or not num_actions:
            return None
        masked = ~(legal == -1).all(1)
        rest = num_actions - 64 * (legal.shape[1] - 1)  # the moves of the last word
        if rest < 64 and bool((masked & ((legal[:, -1] >> rest) != 0)).any()):
            return f"its next_legal hold moves past the game's {num_actions}"
        if bool((masked & ~(legal != 0).any(1)).any()):
            return "its next_legal hold a state with no legal move"
        return None

    def load(self, path, tag: int, num_actions: int | None = None) -> str | None:
        """Refill from a file written by save(); returns why it was not used, or None when it was
        (its values checked too: an action past the network's, a non-finite return or priority would
        fail an update later, far from the file)."""
        names = ("obs", "next_obs", "actions", "returns", "discounts", "next_legal", "leaves")
        try:
            with open_regular(path) as f, np.load(f, allow_pickle=False) as z:  # never unpickles: runs no code
                if int(z["tag"]) != tag:
                    return f"it belongs to update {int(z['tag'])}, the checkpoint to update {tag}"
                heads = {name: _header(z, name) for name in names}  # each array is read once, when copied
                obs_shape, obs_type = heads["obs"]
                if int(z["capacity"]) != self.capacity or obs_shape[1:] != tuple(self.obs.shape[1:]):
                    return (f"it holds {int(z['capacity'])} transitions of shape {obs_shape[1:]}, this buffer "
                            f"{self.capacity} of {tuple(self.obs.shape[1:])}")
                if obs_type != np.dtype(obs_dtype(self.obs.shape[1:])):
                    return f"its observations are {obs_type}, this buffer's {obs_dtype(self.obs.shape[1:])}"
                n, pos = int(z["size"]), int(z["pos"])
                if not (0 <= n <= self.capacity and 0 <= pos < self.capacity):
                    return f"its size {n} or position {pos} does not fit a buffer of {self.capacity}"
                for name, (shape, _) in heads.items():
                    if shape[:1] != (n,):
                        return f"its {name} holds {shape[0] if shape else 'no'} entries, not its size {n}"
                    want = (n, *(self.prio if name == "leaves" else getattr(self, name)).shape[1:])
                    if name == "next_legal" and shape == (n,) and want == (n, 1):  # (one word, as saved before)
                        continue
                    if shape != want:  # (a wrong shape would broadcast into the buffer, or not fit memory)
                        return f"its {name} has shape {shape}, this buffer's {want}"
                if heads["next_obs"][1] != obs_type:
                    return f"its next observations are {heads['next_obs'][1]}, its observations {obs_type}"
                top = num_actions or np.iinfo(np.int64).max
                if heads["actions"][1].kind not in "iu":  # (copied into int64, a float would pass unseen)
                    return f"its actions are not integers 0 to {top - 1}"
                if heads["next_legal"][1] != np.int64:  # (bits: a float of 1e30 would read as other moves)
                    return f"its next_legal are {heads['next_legal'][1]}, not int64 bit words"
                self.size = 0  # until every part is in and checked: a failure below leaves an empty buffer
                for name in names:
                    dst = self.prio if name == "leaves" else getattr(self, name)
                    dst[:n].copy_(torch.from_numpy(np.asarray(z[name])).reshape(dst[:n].shape))
                max_priority = float(z["max_priority"])
                if (bad := self._bad_values(n, top, max_priority) or self._bad_legal(n, num_actions)) is not None:
                    return bad
                self.max_priority = torch.tensor(max_priority, dtype=torch.float64, device=self.device)
                self.pos, self.size = pos, n
        except FileNotFoundError:
            return "the file is missing"
        except NotAFile as e:  # a FIFO there would have held the open (and the learner) forever
            return str(e)
        except Exception as e:  # noqa: BLE001 (a damaged zip, header or array: any of a dozen errors, MemoryError too)
            return f"unreadable ({type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''})"
        return None


def _header(z, name: str) -> tuple[tuple, np.dtype]:
    """An array's shape and dtype in an .npz, from its header alone (an Atari replay's frames are
    gigabytes: z[name] reads and inflates all of them each time it is asked)."""
    with z.zip.open(f"{name}.npy") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
    return tuple(shape), dtype


class NStepAccumulator:
    """Turns a vectorized env's step stream into n-step transitions, on the actor.

    Call `push(obs, actions, rewards, dones, next_obs, cut)` every step (dones[i]: the episode of
    env i ended with this step; cut: (env indices, final observations) of the ones a time limit
    ended, or None). Once n steps are held it returns, for every env, the transition that started
    n steps ago: R = sum_k gamma^k r_k up to the first done; discount = gamma^n and next_obs the obs
    after the n-th step, or, when an episode ended at its k-th step, gamma^k and that episode's
    final observation if a time limit cut it (the task goes on: bootstrap), 0 if it terminated.
    """

    def __init__(self, n: int, gamma: float, num_envs: int, obs_shape):
        self.n, self.gamma = n, gamma
        self.obs = np.zeros((n, num_envs) + tuple(obs_shape), dtype=obs_dtype(obs_shape))
        self.final = None  # a cut episode's last obs per slot: made at the first cut (most envs never cut)
        self.actions = np.zeros((n, num_envs), dtype=np.int64)
        self.rewards = np.zeros((n, num_envs), dtype=np.float32)
        self.dones = np.zeros((n, num_envs), dtype=bool)
        self.cuts = np.zeros((n, num_envs), dtype=bool)
        self.count = 0

    def push(self, obs, actions, rewards, dones, next_obs, cut=None):
        k = self.count % self.n  # ring slot of this step
        self.obs[k], self.actions[k], self.rewards[k], self.dones[k] = obs, actions, rewards, dones
        self.cuts[k] = False
        if cut is not None and len(cut[0]):
            if self.final is None:
                self.final = np.zeros_like(self.obs)
            self.cuts[k, cut[0]], self.final[k, cut[0]] = True, cut[1]
        self.count += 1
        if self.count < self.n:
            return None
        first = self.count % self.n  # oldest slot
        order = (first + np.arange(self.n)) % self.n
        E = self.obs.shape[1]
        ret = np.zeros(E, dtype=np.float32)
        alive = np.ones(E, dtype=bool)
        for j, slot in enumerate(order):
            ret += alive * (self.gamma ** j) * self.rewards[slot]
            alive &= ~self.dones[slot]
        discount = np.where(alive, self.gamma ** self.n, 0.0).astype(np.float32)
        nxt = next_obs
        if self.cuts.any():  # a time limit inside the window: those transitions bootstrap from the final obs
            j = self.dones[order].argmax(0)  # the step each env's episode ended at (when it did)
            slot, envs = order[j], np.arange(E)
            cut_here = ~alive & self.cuts[slot, envs]
            discount[cut_here] = (self.gamma ** (j[cut_here] + 1.0)).astype(np.float32)
            if cut_here.any():
                nxt = np.array(next_obs, copy=True)
                nxt[cut_here] = self.final[slot[cut_here], envs[cut_here]]
        return self.obs[first].copy(), self.actions[first].copy(), ret, discount, nxt


def double_dqn_loss(q_online, q_next_online, q_next_target, actions, returns, discounts, weights,
                    next_legal=None):
    """Importance-weighted Huber loss of the double-DQN target. Returns (loss, |td error|).
    next_legal (B, A) bool: the target's argmax only over the legal actions of next_obs."""
    q = q_online.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        if next_legal is not None:
            q_next_online = q_next_online.masked_fill(~next_legal, float("-inf"))
        best = q_next_online.argmax(dim=1, keepdim=True)
        target = returns + discounts * q_next_target.gather(1, best).squeeze(1)
    td = target - q
    loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
    return loss, td.detach().abs()


def mirror_half_device(batch: dict, flip: torch.Tensor, num_actions: int) -> dict:
    """Left-right mirror the rows of a sampled batch (PrioritizedReplay.sample's tensors, on its device)
    where the bool tensor `flip` is true, for games whose rules are symmetric under it (Connect Four):
    the frames of obs and next_obs flip along the width, action a becomes num_actions-1-a, the next
    state's legal-move bits reverse. Twice the distinct data at no env cost. Replaces the batch's
    entries, returns the batch."""
    B = flip.shape[0]
    both = torch.cat([flip, flip])  # the rows of obs, then of next_obs, in `frames`
    frames = batch["frames"]
    frames = torch.where(both[:, None, None, None], frames.flip(2), frames)
    batch["frames"], batch["obs"], batch["next_obs"] = frames, frames[:B], frames[B:]
    batch["actions"] = torch.where(flip, num_actions - 1 - batch["actions"], batch["actions"])
    legal = batch["next_legal"]  # (B, words)
    mirrored = mask_bits(bits_to_mask(legal, num_actions).flip(1))
    batch["next_legal"] = torch.where((flip & (legal != -1).any(1))[:, None], mirrored, legal)
    return batch
