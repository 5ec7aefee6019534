"""mpippo's Adam is torch.optim.Adam's arithmetic without torch.optim's compiler wrappers."""
import copy
import subprocess
import sys

import pytest
import torch

from mpippo.algos.adam import Adam


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    b = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _train(model, opt, steps: int, seed: int = 1, anneal: bool = True):
    g = torch.Generator().manual_seed(seed)
    for k in range(steps):
        if anneal:
            opt.param_groups[0]["lr"] = 1e-2 * (1 - k / (2 * steps))
        x = torch.randn(16, 5, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def _assert_equal(a, b):
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), k


def test_steps_are_bit_identical_to_torch_adam():
    """With the default kernels (fused=False) as torch.optim.Adam's default; the fused kernel, mpippo's
    default, is compared with torch's fused Adam below."""
    a, b = _pair()
    ours = Adam(a.parameters(), lr=1e-2, eps=1e-5, fused=False)
    theirs = torch.optim.Adam(b.parameters(), lr=1e-2, eps=1e-5)
    _train(a, ours, 25)
    _train(b, theirs, 25)
    _assert_equal(a, b)
    for i, s in ours.state_dict()["state"].items():
        t = theirs.state_dict()["state"][i]
        assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s), i


@pytest.mark.parametrize("direction", ["torch_to_ours", "ours_to_torch"])
def test_state_dicts_load_into_each_other_and_training_continues_identically(direction):
    a, b = _pair()
    ours = lambda params, **kw: Adam(params, fused=False, **kw)  # noqa: E731 (torch.optim.Adam's default kernels)
    first = (torch.optim.Adam if direction == "torch_to_ours" else ours)(a.parameters(), lr=1e-2, eps=1e-5)
    _train(a, first, 10)
    b.load_state_dict(a.state_dict())
    second = (ours if direction == "torch_to_ours" else torch.optim.Adam)(b.parameters(), lr=1.0, eps=1.0)
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # as from a file: no tensors shared
    assert second.param_groups[0]["lr"] == first.param_groups[0]["lr"] and second.param_groups[0]["eps"] == 1e-5
    _train(a, first, 10, seed=2, anneal=False)
    _train(b, second, 10, seed=2, anneal=False)
    _assert_equal(a, b)


def test_a_state_of_other_shapes_is_refused():
    a, _ = _pair()
    opt = Adam(a.parameters(), lr=1e-2, eps=1e-5)
    _train(a, opt, 1)
    other = Adam(torch.nn.Linear(5, 7).parameters(), lr=1e-2, eps=1e-5)
    with pytest.raises(ValueError, match="1 group of 2"):
        other.load_state_dict(opt.state_dict())
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        Adam(a.parameters(), lr=1e-2, eps=1e-5).load_state_dict(sd)


def test_zero_grad_in_place_keeps_gradient_views():
    flat = torch.zeros(6, requires_grad=True)
    flat.grad = torch.arange(6.0)
    view = flat.grad[2:4]
    Adam([flat], lr=1e-2, eps=1e-5).zero_grad(set_to_none=False)
    assert flat.grad is not None and view.data_ptr() == flat.grad.data_ptr() + 2 * 4
    assert torch.count_nonzero(flat.grad) == 0


def test_training_with_it_does_not_import_the_compiler_stack():
    """The point of the class: torch.optim.Adam would import torch._dynamo here (2.2 s of CPU)."""
    code = ("import sys, torch\nfrom mpippo.algos.adam import Adam\n"
            "m = torch.nn.Linear(3, 2); o = Adam(m.parameters(), lr=1e-3, eps=1e-5)\n"
            "m(torch.ones(1, 3)).sum().backward(); o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\n"
            "torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)\n"
            "print('torch._dynamo' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_fused_steps_are_torch_fused_adams_and_checkpoints_cross_kernels():
    """fused (the default on every device): bit-identical to torch.optim.Adam(fused=True), its step
    count where that one keeps it; a state of the default kernels loads into the fused one and back,
    each keeping its own kernel."""
    a, b = _pair()
    ours = Adam(a.parameters(), lr=1e-2, eps=1e-5)
    theirs = torch.optim.Adam(b.parameters(), lr=1e-2, eps=1e-5, fused=True)
    _train(a, ours, 12)
    _train(b, theirs, 12)
    _assert_equal(a, b)
    assert ours.param_groups[0]["fused"] is True and ours.state_dict()["state"][0]["step"].dtype == torch.float32
    plain = Adam(b.parameters(), lr=1.0, eps=1.0, fused=False)
    assert plain.param_groups[0]["fused"] is None  # the default kernels, as torch.optim.Adam writes it
    plain.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert plain.param_groups[0]["fused"] is None and plain.param_groups[0]["eps"] == 1e-5
    back = Adam(a.parameters(), lr=1.0, eps=1.0)
    back.load_state_dict(copy.deepcopy(plain.state_dict()))
    assert back.param_groups[0]["fused"] is True
    assert all(torch.equal(s["step"], torch.tensor(12.0)) for s in back.state.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (gpu_session.sh runs it)")
def test_cuda_parameters_take_the_fused_kernel_and_resume_across_devices():
    torch.manual_seed(0)
    gpu = torch.nn.Linear(5, 3).cuda()
    opt = Adam(gpu.parameters(), lr=1e-2, eps=1e-5)
    assert opt.param_groups[0]["fused"] is True
    ref_model = torch.nn.Linear(5, 3).cuda()
    ref_model.load_state_dict(gpu.state_dict())
    ref = torch.optim.Adam(ref_model.parameters(), lr=1e-2, eps=1e-5, fused=True)
    _train(gpu, opt, 5, anneal=False)
    _train(ref_model, ref, 5, anneal=False)
    _assert_equal(gpu, ref_model)
    assert all(s["step"].is_cuda for s in opt.state.values())
    cpu = torch.nn.Linear(5, 3)
    cpu.load_state_dict({k: v.cpu() for k, v in gpu.state_dict().items()})
    on_cpu = Adam(cpu.parameters(), lr=1.0, eps=1.0)
    on_cpu.load_state_dict({"state": {i: {k: v.cpu() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()},
                            "param_groups": opt.state_dict()["param_groups"]})
    assert on_cpu.param_groups[0]["fused"] is None and all(not s["step"].is_cuda for s in on_cpu.state.values())
    _train(cpu, on_cpu, 2)
