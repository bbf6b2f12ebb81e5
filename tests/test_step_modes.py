"""The compiled step mode trains the same network in the same math as the eager one.

Compiling a ResNet-32's modules takes minutes on a CPU, so these tests compile shallower CIFAR
ResNets of the same blocks (ResNet-8 and ResNet-20, registered for the test only): the code that
is compiled, module by module, is the same. Inductor moves fp32 numbers only by the order of its
sums; the tolerances below state by how much.
"""

import pandas as pd
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from infopro import models, step
from infopro.config import TrainConfig, build_net
from infopro.errors import InfoProError
from infopro.local import OBJECTIVES
from infopro.records import read_json
from infopro.step import compile_modules, resolve_step_mode, train_step
from infopro.train import OneProcess, train

# After one step, every local module's gradient (all its parameters as one vector) lies within this
# fraction of its norm of the eager step's: measured at 1.3e-6 (E2E), 1.4e-5 (greedy SL), 4.1e-6
# (InfoPro) and 4.7e-6 (DGL) on a CPU, with each module's loss within 2e-7 of the eager one's.
GRADIENT_TOLERANCE = 1e-4
LOSS_TOLERANCE = 1e-5  # relative, each module's loss of the same step
SHALLOW = dict(dataset="synthetic", train_subset=40, test_subset=20, batch_size=16, epochs=2, warmup_epochs=1,
               lr=0.05)


@pytest.fixture
def shallow_archs(monkeypatch):
    monkeypatch.setitem(models.ARCHS, "resnet8", 8)
    monkeypatch.setitem(models.ARCHS, "resnet20", 20)
    torch._dynamo.reset()
    counters.clear()


def shallow_config(regime: str, K: int, arch: str = "resnet8", **overrides) -> TrainConfig:
    """ResNet-8 has four layer points: K = 2 cuts after the second."""
    infopro = dict(task_loss="contrast", lambda1=(1.0, 1.0), lambda2=(1.0, 1.0)) if regime == "infopro" else {}
    split = ",".join(map(str, range(1, K))) if K > 2 else "2"
    return TrainConfig(arch=arch, regime=regime, K=K, **({"split": split} if K > 1 else {}), **infopro,
                       **overrides)


def one_step(net, modules, batch):
    x, y = batch
    net.zero_grad(set_to_none=True)
    losses, _ = train_step(net, x, y, modules=modules)
    gradients = [torch.cat([p.grad.flatten() for p in module.parameters() if p.grad is not None])
                 for module in net.local_modules]
    return losses, gradients


def test_auto_takes_the_mode_the_gpus_epoch_benchmark_found_faster_else_eager(tmp_path, monkeypatch):
    """A GPU model whose benchmark found compiled steps faster trains compiled; one whose benchmark found
    eager steps faster, one not yet measured in both modes, one with no benchmark, and a CPU step eagerly."""
    rows = [dict(method="e2e", K=1, mode="eager", precision="fp32", epoch_seconds=1.0),
            dict(method="e2e", K=1, mode="compiled", precision="fp32", epoch_seconds=0.5)]
    pd.DataFrame(rows).to_csv(tmp_path / "epoch-resnet32-fast-compiler.csv", index=False)
    pd.DataFrame(rows[:1]).to_csv(tmp_path / "epoch-resnet32-half-measured.csv", index=False)
    rows[1]["epoch_seconds"] = 1.5
    pd.DataFrame(rows).to_csv(tmp_path / "epoch-resnet32-slow-compiler.csv", index=False)
    for gpu, mode in (("fast-compiler", "compiled"), ("slow-compiler", "eager"), ("half-measured", "eager"),
                      ("unmeasured", "eager")):
        monkeypatch.setattr(step, "device_slug", lambda device, gpu=gpu: gpu)  # no CUDA needed to name a GPU
        assert resolve_step_mode("auto", torch.device("cuda"), tmp_path) == mode, gpu
    assert resolve_step_mode("auto", torch.device("cpu"), tmp_path) == "eager"


def test_a_mode_named_is_taken_and_an_unknown_one_is_refused():
    assert resolve_step_mode("compiled", torch.device("cpu")) == "compiled"
    with pytest.raises(InfoProError, match="unknown step mode 'fast'"):
        resolve_step_mode("fast", torch.device("cpu"))


def test_every_module_keeps_its_graph_for_the_full_and_the_last_batch(shallow_archs):
    """Eight modules, two batch shapes: more graphs of `LocalModule.forward` than dynamo keeps by default
    (8), so without the raised limit later modules would fail or run eagerly. The capture (dynamo and
    AOTAutograd, without inductor's code generation) reproduces the eager step."""
    config = shallow_config("greedy", 8, arch="resnet20")
    eager, compiled = build_net(config), build_net(config)
    modules = compile_modules(compiled.local_modules, backend="aot_eager")
    for size in (8, 5, 8):
        batch = torch.rand(size, 3, 32, 32), torch.randint(0, 10, (size,))
        eager_losses, eager_gradients = one_step(eager, None, batch)
        losses, gradients = one_step(compiled, modules, batch)
        torch.testing.assert_close(losses, eager_losses)
        for got, want in zip(gradients, eager_gradients):
            torch.testing.assert_close(got, want)
    assert counters["stats"]["unique_graphs"] > 8


@pytest.mark.slow
@pytest.mark.parametrize("regime,K", [("e2e", 1)] + [(regime, 2) for regime in OBJECTIVES])
def test_inductor_step_matches_the_eager_step(shallow_archs, regime, K):
    config = shallow_config(regime, K)
    eager, compiled = build_net(config), build_net(config)
    modules = compile_modules(compiled.local_modules)
    generator = torch.Generator().manual_seed(0)
    batch = torch.rand(8, 3, 32, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator)
    eager_losses, eager_gradients = one_step(eager, None, batch)
    losses, gradients = one_step(compiled, modules, batch)
    torch.testing.assert_close(losses, eager_losses, rtol=LOSS_TOLERANCE, atol=0)
    for got, want in zip(gradients, eager_gradients):
        assert (got - want).norm() <= GRADIENT_TOLERANCE * want.norm()


@pytest.mark.slow
def test_a_compiled_run_trains_as_the_eager_run_and_says_how_it_stepped(shallow_archs, tmp_path):
    """Two epochs of InfoPro with a last, smaller batch (40 = 2 x 16 + 8), through `train`."""
    config = shallow_config("infopro", 2, **SHALLOW)
    runs = {mode: tmp_path / mode for mode in ("eager", "compiled")}
    for mode, out in runs.items():
        train(config, out, device="cpu", step_mode=mode, log=lambda line: None)
    metrics = {mode: pd.read_csv(out / "metrics.csv") for mode, out in runs.items()}
    losses = [column for column in metrics["eager"] if column.startswith("loss_m")]
    pd.testing.assert_frame_equal(metrics["compiled"][losses], metrics["eager"][losses], rtol=1e-4)
    assert counters["stats"]["unique_graphs"] == config.K  # whole batches only: the last one steps eagerly
    assert read_json(runs["compiled"] / "config.json")["provenance"]["step_mode"] == "compiled"
    assert read_json(runs["eager"] / "config.json")["provenance"]["step_mode"] == "eager"
    ended = metrics["compiled"]["ended_at"]
    assert ended.is_monotonic_increasing and ended.diff().iloc[1] >= metrics["compiled"]["epoch_seconds"].iloc[1]


def test_compiled_modules_take_whole_batches_and_the_last_one_steps_eagerly(shallow_archs):
    """A second batch shape would compile every module again, for one batch an epoch."""
    replicas = OneProcess(torch.device("cpu"), step_mode="compiled")
    replicas.wrap(build_net(shallow_config("greedy", 2)))  # torch.compile is lazy: nothing compiles here
    assert len(replicas.compiled) == 2 and replicas.modules_for(16, 16) is replicas.compiled
    assert replicas.modules_for(8, 16) is None  # the network's own modules
    eager = OneProcess(torch.device("cpu"))
    eager.wrap(build_net(shallow_config("greedy", 2)))
    assert eager.modules_for(16, 16) is None


def test_the_default_mode_on_a_cpu_is_eager(tmp_path):
    config = TrainConfig(regime="greedy", K=2, **SHALLOW)
    train(config, tmp_path / "run", device="cpu", log=lambda line: None)
    assert read_json(tmp_path / "run" / "config.json")["provenance"]["step_mode"] == "eager"
