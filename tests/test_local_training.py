"""What the paper's claims rest on: gradient isolation, K=1 = E2E, gradients, memory, learning."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from infopro.config import TrainConfig, build_net
from infopro.device import prepare_input
from infopro.errors import InfoProError
from infopro.local import OBJECTIVES, TASK_LOSSES, DGLObjective, supervised_contrastive_loss
from infopro.memory import SavedActivations
from infopro.step import train_step
from infopro.train import train

# E2E and every regime of `OBJECTIVES` at K = 4 (InfoPro once per task loss): a local loss added there is
# tested below for gradient isolation, gradients, host copies and learning without a word here.
REGIMES = [("e2e", 1, None)] + [(regime, 4, task) for regime in OBJECTIVES
                                for task in (TASK_LOSSES if regime == "infopro" else (None,))]
LOCAL = [(regime, task) for regime, _, task in REGIMES[1:]]


def fixed_batch(n=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 32, 32, generator=generator), torch.arange(n) % 10


def gradients(net):
    return {name: None if p.grad is None else p.grad.clone() for name, p in net.named_parameters()}


def module_loss(net, k, x, y):
    """Module k's loss alone, its input the detached output of the modules before it."""
    h = prepare_input(x, x.device)
    with torch.no_grad():
        for j in range(k):
            for layer in net.segment(j):
                h = layer(h)
    for layer in net.segment(k):
        h = layer(h)
    if k < net.K - 1:
        return net.objectives[k](h, x, y)
    return F.cross_entropy(net.backbone.head(h), y)


@pytest.mark.parametrize("regime,task", LOCAL)
def test_no_gradient_crosses_a_module_boundary(regime, task):
    x, y = fixed_batch()
    net = build_net(TrainConfig(regime=regime, K=4, task_loss=task, dataset="synthetic"))
    train_step(net, x, y)
    combined = gradients(net)
    owner = net.module_of_parameter()
    for k in range(net.K):
        net.zero_grad(set_to_none=True)
        module_loss(net, k, x, y).backward()
        for name, p in net.named_parameters():
            if owner[name] == k:
                assert (p.grad is None) == (combined[name] is None), name
                assert p.grad is None or torch.allclose(p.grad, combined[name], atol=1e-6), name
            else:
                assert p.grad is None, f"module {k}'s loss reached {name} (module {owner[name]})"


@pytest.mark.parametrize("channels,size,reduced", [(16, 32, 8), (32, 16, 4), (64, 8, 2)])
def test_dgl_auxiliary_net_is_dgls_mlp_sr(channels, size, reduced):
    """Spatial reduction to ceil(s/4), three 1x1 convolutions at C channels, 2x2 pooling, three
    4C-wide Linear-BN-ReLU layers and a linear layer to the classes, on every stage of ResNet-32."""
    layers = list(DGLObjective(channels, size, 10).classifier)
    pools = [layer.output_size for layer in layers if isinstance(layer, nn.AdaptiveAvgPool2d)]
    convs = [(layer.in_channels, layer.out_channels, layer.kernel_size) for layer in layers if isinstance(layer, nn.Conv2d)]
    linears = [(layer.in_features, layer.out_features) for layer in layers if isinstance(layer, nn.Linear)]
    assert pools == [reduced, 2] and convs == [(channels, channels, (1, 1))] * 3
    assert linears == [(4 * channels, 4 * channels)] * 3 + [(4 * channels, 10)]
    assert sum(isinstance(layer, nn.BatchNorm1d) for layer in layers) == 3
    h, y = torch.randn(5, channels, size, size), torch.arange(5)
    loss = DGLObjective(channels, size, 10)(h, None, y)
    assert loss.shape == () and torch.isfinite(loss)


def test_dgl_refuses_a_last_batch_of_one_image_before_its_run_directory_opens(tmp_path):
    config = TrainConfig(regime="dgl", K=2, dataset="synthetic", train_subset=257, test_subset=64, batch_size=64)
    with pytest.raises(InfoProError, match=r"holds 1 image \(257 mod 64\)"):
        train(config, tmp_path / "run", device="cpu", log=lambda line: None)
    assert not (tmp_path / "run").exists()


def test_infopro_with_one_module_is_end_to_end():
    x, y = fixed_batch()
    e2e = build_net(TrainConfig(regime="e2e", dataset="synthetic"))
    infopro = build_net(TrainConfig(regime="infopro", K=1, dataset="synthetic"))
    assert all(torch.equal(a, b) for a, b in zip(e2e.state_dict().values(), infopro.state_dict().values()))
    loss_e2e, _ = train_step(e2e, x, y)
    loss_infopro, _ = train_step(infopro, x, y)
    assert torch.equal(loss_e2e, loss_infopro)
    for (name, a), b in zip(e2e.named_parameters(), infopro.parameters()):
        assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("regime,K,task", REGIMES + [("infopro", 16, "contrast")])
def test_every_parameter_gets_a_gradient(regime, K, task):
    x, y = fixed_batch(32)
    net = build_net(TrainConfig(regime=regime, K=K, task_loss=task, dataset="synthetic",
                                lambda1=(1, 1), lambda2=(1, 1)))
    losses, _ = train_step(net, x, y)
    assert losses.shape == (K,) and torch.isfinite(losses).all()
    missing = [name for name, p in net.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


def test_terms_with_zero_weight_are_not_computed():
    x, y = fixed_batch()
    net = build_net(TrainConfig(regime="infopro", K=4, dataset="synthetic"))  # paper: λ2 = 0, 1, 2
    train_step(net, x, y)
    first = net.objectives[0]
    assert first.lambda2 == 0 and all(p.grad is None for p in first.aux_head.parameters())
    assert all(p.grad is not None for p in first.decoder.parameters())
    assert all(p.grad is not None for p in net.backbone.parameters())


def test_saved_activation_counter_on_known_graphs():
    x = torch.randn(8, 100)
    linear = torch.nn.Linear(100, 50)
    with SavedActivations() as saved:
        torch.relu(linear(x)).sum().backward()
    assert saved.peak_bytes == x.nbytes + 8 * 50 * 4  # linear saves x, relu saves its output
    assert saved.current_bytes == 0                    # everything released after backward
    with SavedActivations() as saved:
        a = x.clone().requires_grad_()
        (a * a).sum().backward()                       # the same storage saved twice counts once
    assert saved.peak_bytes == x.nbytes


def peak_saved(regime, K, batch=32):
    x, y = fixed_batch(batch)
    net = build_net(TrainConfig(regime=regime, K=K, dataset="synthetic"))
    with SavedActivations() as saved:
        train_step(net, x, y)
    return saved.peak_bytes


def test_infopro_k16_saves_at_most_a_quarter_of_e2e_activations():
    e2e = peak_saved("e2e", 1)
    by_k = {K: peak_saved("infopro", K) for K in (2, 4, 16)}
    assert by_k[16] <= 0.25 * e2e, (by_k, e2e)
    assert by_k[16] < by_k[4] < by_k[2] < e2e
    assert peak_saved("greedy", 16) <= by_k[16]


def test_supervised_contrastive_loss_on_known_geometry():
    labels = torch.tensor([0, 0, 1, 1])
    aligned = torch.tensor([[1.0, 0], [1.0, 0], [0, 1.0], [0, 1.0]])
    anti = torch.tensor([[1.0, 0], [0, 1.0], [1.0, 0], [0, 1.0]])
    assert supervised_contrastive_loss(aligned, labels) < supervised_contrastive_loss(anti, labels)
    # One positive among three candidates of equal similarity: loss = log 3.
    equal = torch.eye(4)
    assert torch.isclose(supervised_contrastive_loss(equal, labels, temperature=1.0), torch.log(torch.tensor(3.0)))
    # Anchors without a positive contribute 0 to the mean.
    assert supervised_contrastive_loss(equal, torch.tensor([0, 1, 2, 3])) == 0


def tensors_in(value) -> list[torch.Tensor]:
    """The tensors among a call's arguments or results, however nested in tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return tensors_in(list(value.values()))
    return []


class HostToDevice(TorchFunctionMode):
    """Records each call that brings host data onto the device: a host tensor used with device
    tensors (an index, an operand, a `.to(device)`), or a tensor built from Python data there.

    On CUDA each such copy waits for the GPU to drain its queue (a stream sync), so the CPU can
    no longer launch ahead of the GPU; on the meta device the calls are cheap and still visible.
    """

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        inputs, outputs = tensors_in((args, kwargs)), tensors_in(result)
        from_host = func in (torch.tensor, torch.as_tensor) or any(t.device.type == "cpu" for t in inputs)
        if from_host and any(t.device.type != "cpu" for t in inputs + outputs):
            self.calls.append(getattr(func, "__name__", str(func)))
        return result


@pytest.mark.parametrize("regime,K,task", REGIMES)
def test_a_training_step_brings_no_host_data_to_the_device(regime, K, task):
    """Run on the meta device, where reading a value back (`.item()`, `if tensor:`) raises: a step
    neither waits for the device's values nor copies host data to it, so on CUDA the CPU queues
    the whole step without a stream sync (the first step may set up per-device constants)."""
    net = build_net(TrainConfig(regime=regime, K=K, task_loss=task, dataset="synthetic")).to("meta")
    x, y = (t.to("meta") for t in fixed_batch())
    train_step(net, x, y)
    with HostToDevice() as copies:
        train_step(net, x, y)
    assert copies.calls == []


SMOKE = dict(dataset="synthetic", train_subset=1000, test_subset=500, epochs=2, batch_size=32,
             lr=0.05, warmup_epochs=0)


# The regimes whose objective the others share in part (greedy SL's and DGL's local cross-entropy is
# E2E's at a shallower head, Softmax's decoder Contrast's) learn in the slow set: a smoke run costs 15
# to 20 s on 2 cores.
LEARNING = [pytest.param(*regime, marks=pytest.mark.slow) if regime[0] in ("greedy", "dgl") or regime[2] == "softmax"
            else regime for regime in REGIMES]


@pytest.mark.parametrize("regime,K,task", LEARNING)
def test_short_run_learns(regime, K, task, tmp_path):
    summary = train(TrainConfig(regime=regime, K=K, task_loss=task, **SMOKE), tmp_path / "run",
                    device="cpu", log=lambda line: None)
    assert summary["final_test_error"] < 45, summary  # chance is 90%
