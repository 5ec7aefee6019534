"""The rollout's policy step (algos.policy_gradient.PolicyStep): the same actions, log-probs and values as the
step written out by hand, from the same generator state; Gumbel-max draws from softmax(logits); a
capture that fails falls back to eager with one warning; on a GPU, the graphed step equals the
eager one bit for bit while the weights change in place (CUDA only: run by gpu_session.sh)."""
import contextlib

import numpy as np
import pytest
import torch

from mpippo.algos.policy_gradient import GumbelSampler, PolicyStep, autocast, gumbel_max
from mpippo.models.flat import flat_model_
from mpippo.models.impala_cnn import ImpalaCNNPolicy

OBS, ACTIONS, ENVS = (64, 64, 3), 15, 6


def net(device="cpu", seed=0):
    torch.manual_seed(seed)
    model = ImpalaCNNPolicy(OBS, ACTIONS).to(device)
    with torch.no_grad():  # a policy far from uniform, so a wrong log-prob or action shows
        model.policy.weight.normal_(0.0, 0.5)
    return model


def frames(seed, device="cpu", n=ENVS):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, *OBS), dtype=torch.uint8, generator=g).to(device)


def by_hand(model, sampler, obs, precision):
    """The step as the rollout wrote it before PolicyStep (and as the checkpoints' streams assume)."""
    with autocast(obs.device, precision):
        logits, value = model(obs)
    action = gumbel_max(logits, torch.rand(logits.shape, generator=sampler.generator, device=logits.device))
    logprob = torch.log_softmax(logits.float(), dim=-1).gather(1, action.unsqueeze(1)).squeeze(1)
    return action, logprob, value.float()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_step_is_the_hand_written_one_from_the_same_generator_state(precision):
    model = net()
    mine, theirs = GumbelSampler(torch.device("cpu"), 7), GumbelSampler(torch.device("cpu"), 7)
    step = PolicyStep(model, mine, OBS, ENVS, ACTIONS, torch.device("cpu"), precision, graph=True)
    assert step.mode == "eager" and step.obs is None  # the CPU never captures
    seen = set()
    with torch.inference_mode():
        for k in range(5):
            obs = frames(k)
            got, want = step(obs), by_hand(model, theirs, obs, precision)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and torch.equal(a, b)
            seen.update(got[0].tolist())
    assert len(seen) > 3  # sampled, not argmax of one logit
    assert torch.equal(mine.get_state(), theirs.get_state())  # the stream advanced alike


def test_a_restored_sampler_draws_the_same_actions():
    model, dev = net(), torch.device("cpu")
    sampler = GumbelSampler(dev, 3)
    step = PolicyStep(model, sampler, OBS, ENVS, ACTIONS, dev, "fp32", graph=False)
    with torch.inference_mode():
        step(frames(0))
        saved = sampler.get_state()
        first = [step(frames(k))[0].clone() for k in range(1, 4)]
        sampler.set_state(saved)
        again = [step(frames(k))[0].clone() for k in range(1, 4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_gumbel_max_draws_from_the_softmax():
    logits = torch.tensor([[2.0, 0.5, -1.0, 0.0]]).expand(40_000, 4)
    u = torch.rand(logits.shape, generator=torch.Generator().manual_seed(1))
    counts = np.bincount(gumbel_max(logits, u).numpy(), minlength=4) / len(u)
    want = torch.softmax(logits[0], -1).numpy()
    assert np.abs(counts - want).max() < 0.01, (counts, want)  # 4+ std of a frequency at n = 40,000


def test_a_capture_that_fails_falls_back_to_eager_with_one_warning(monkeypatch):
    model, dev = net(), torch.device("cpu")
    warned = []
    step = PolicyStep(model, GumbelSampler(dev, 5), OBS, ENVS, ACTIONS, dev, "fp32", graph=False, warn=warned.append)
    step.mode, step.obs = "graph", torch.zeros((ENVS, *OBS), dtype=torch.uint8)  # as on a GPU, before capture

    def no_stream(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
    monkeypatch.setattr(torch.cuda, "current_stream", no_stream)
    reference = GumbelSampler(dev, 5)
    with torch.inference_mode():
        for k in range(3):
            obs = frames(k)
            got, want = step(obs), by_hand(model, reference, obs, "fp32")
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert step.mode == "eager" and step.graph is None
    assert len(warned) == 1 and "could not be captured as a CUDA graph (operation not permitted" in warned[0]


def fake_cuda(monkeypatch):
    """torch.cuda's stream and graph calls as no-ops, so the capture's decisions run on the CPU: a
    'replay' leaves the outputs of the capture-time call as they are (what an empty graph would do)."""
    class Stream:
        def wait_stream(self, other):
            pass

    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, stream=None: contextlib.nullcontext())
    return Graph


@pytest.mark.parametrize("reproduces", [True, False])
def test_a_captured_step_is_kept_only_if_it_reproduces_the_eager_one(monkeypatch, reproduces):
    """After capture the graph is replayed once against the eager step on the same input and noise; a
    graph whose outputs differ (an empty or wrong capture) is dropped for eager, with one warning."""
    Graph = fake_cuda(monkeypatch)
    model, dev, warned = net(), torch.device("cpu"), []
    step = PolicyStep(model, GumbelSampler(dev, 5), OBS, ENVS, ACTIONS, dev, "fp32", graph=False, warn=warned.append)
    step.mode, step.obs = "graph", torch.zeros((ENVS, *OBS), dtype=torch.uint8)
    calls, real = [], step._step

    def counted(obs):  # the check's own eager call (after warm-up and capture) sees other weights
        calls.append(1)
        out = real(obs)
        return out if reproduces or len(calls) <= PolicyStep.WARMUP + 1 else (out[0], out[1] + 1.0, out[2])
    step._step = counted
    with torch.inference_mode():
        step(frames(0))
    # warm-up, capture, the check; then the step itself: one more replay, or (dropped) one more eager call
    assert (len(calls), Graph.replays) == ((PolicyStep.WARMUP + 2, 2) if reproduces else (PolicyStep.WARMUP + 3, 1))
    if reproduces:
        assert step.mode == "graph" and isinstance(step.graph, Graph) and warned == []
    else:
        assert step.mode == "eager" and step.graph is None
        assert len(warned) == 1 and "did not reproduce the eager one" in warned[0]


def test_the_trunk_runs_channels_last():
    """HWC frames permuted to NCHW are channels-last in memory, and convolutions keep that format: the
    whole conv stack (and its bf16 autocast) runs NHWC without a conversion of the activations."""
    model, seen = net(), []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(lambda mod, i, o: seen.append(o.is_contiguous(memory_format=torch.channels_last)))
    for precision in ("fp32", "bf16"):
        with torch.inference_mode(), autocast(torch.device("cpu"), precision):
            model(frames(0))
    assert len(seen) == 2 * 15 and all(seen)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (gpu_session.sh runs it)")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graphed_step_equals_eager_while_weights_change_in_place(precision):
    dev = torch.device("cuda")
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        model = net(dev)
        flat, _ = flat_model_(model)
        graphed = PolicyStep(model, GumbelSampler(dev, 9), OBS, 64, ACTIONS, dev, precision, graph=True)
        eager = PolicyStep(model, GumbelSampler(dev, 9), OBS, 64, ACTIONS, dev, precision, graph=False)
        with torch.inference_mode():
            for k in range(6):
                obs = frames(k, dev, 64)
                got = [t.clone() for t in graphed(obs)]
                want = eager(obs)
                assert graphed.mode == "graph" and graphed.graph is not None
                assert all(torch.equal(a, b) for a, b in zip(got, want)), k
                flat.mul_(0.97).add_(1e-3)  # an optimizer step: in place, where the graph reads
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
