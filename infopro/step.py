"""One training step of a local network, and its evaluation.

One step (`train_step`): module k runs on the detached output of module k-1, its local loss
is back-propagated at once (freeing its graph), and its output is detached, so no gradient
crosses a module boundary and only one module's activations are alive at a time. The trainer
then takes a single SGD step for every module ("simultaneous" training, as the paper's code).

A step runs eagerly or with each module compiled (`compile_modules`); `auto` picks the mode the epoch
benchmark of the GPU model found faster (`auto_step_mode`).
"""

from pathlib import Path

import pandas as pd
import torch

from infopro.augment import to_unit
from infopro.data import Split
from infopro.device import autocast, prepare_input
from infopro.errors import InfoProError
from infopro.local import LocalModule, LocalNet, run_layers
from infopro.records import REPO_ROOT, device_slug, read_table

EVAL_BATCH = 1000
STEP_MODES = ("auto", "eager", "compiled")
EPOCH_BENCH = REPO_ROOT / "results" / "bench"  # where the epoch benchmark's tables are committed, one per GPU model
RUN_EPOCHS = 160  # a whole run of the paper's recipe in one process: where compiling costs the least per epoch


def module_step(module: LocalModule, h: torch.Tensor, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
                run_segment=run_layers, loss_scale: float = 1.0):
    """Forward and backward of one local module on its (detached) input h; no optimizer step.

    `module` is `net.local_modules[k]` (or a DDP wrapper of it); x is the augmented input in
    [0, 1]. The loss is multiplied by `loss_scale` before backward (data-parallel shards of
    unequal size weigh their mean losses so). Returns the module's detached output (the next
    module's input: no gradient crosses the boundary), its detached loss and, for the last
    module, the number of misclassified samples (else None). All three trainers (synchronous,
    module-parallel, data-parallel) run exactly this.
    """
    with autocast(h.device, precision):
        h, loss, logits = module(h, x, y, run_segment)
    (loss * loss_scale).backward()  # frees the module's graph before the next module runs
    wrong = None if logits is None else (logits.argmax(1) != y).sum()
    return h.detach(), loss.detach(), wrong


def train_step(net: LocalNet, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
               run_segment=run_layers, modules=None, loss_scale: float = 1.0):
    """Forward and backward through the K modules for one batch x in [0, 1]; no optimizer step.

    `run_segment(layers, h)` runs one module's backbone layers (the benchmark swaps in
    gradient checkpointing here); `modules` replaces `net.local_modules` (data-parallel
    training passes their DDP wrappers). Returns each module's loss and the number of
    misclassified samples at the network's head, as device tensors (no host synchronisation).
    """
    h = prepare_input(x, x.device)
    losses = []
    for module in modules or net.local_modules:
        h, loss, wrong = module_step(module, h, x, y, precision, run_segment, loss_scale)
        losses.append(loss)
    return torch.stack(losses), wrong


@torch.inference_mode()
def predict(net: LocalNet, split: Split, precision: str = "fp32") -> torch.Tensor:
    """The head's class for each image of `split`, un-augmented, BN in eval mode (on the split's device)."""
    was_training = net.training
    net.eval()
    classes = []
    for start in range(0, len(split), EVAL_BATCH):
        images = split.images[start:start + EVAL_BATCH]
        with autocast(images.device, precision):
            classes.append(net.backbone(prepare_input(to_unit(images), images.device)).argmax(1))
    net.train(was_training)
    return torch.cat(classes)


def correct_per_image(net: LocalNet, split: Split, precision: str = "fp32") -> torch.Tensor:
    """Whether the network's head classifies each image of `split` rightly (un-augmented, BN in eval mode)."""
    return predict(net, split, precision) == split.labels


def evaluate(net: LocalNet, split: Split, precision: str = "fp32") -> float:
    """Test error (%) of the network's head on un-augmented images, BN in eval mode."""
    wrong = (~correct_per_image(net, split, precision)).sum()
    return 100.0 * wrong.item() / len(split)


def resolve_step_mode(name: str, device: torch.device, bench: Path = EPOCH_BENCH) -> str:
    """`eager` or `compiled`; `auto` is `auto_step_mode` of the device's GPU model (eager on a CPU)."""
    if name not in STEP_MODES:
        raise InfoProError(f"unknown step mode {name!r}; valid: {', '.join(STEP_MODES)}")
    if name == "auto":
        return auto_step_mode(device_slug(device) if device.type == "cuda" else None, bench)
    return name


def auto_step_mode(gpu: str | None, bench: Path = EPOCH_BENCH) -> str:
    """The mode a run takes by default on the GPU model `gpu` (a device slug; None: a CPU): the one its epoch
    benchmark under `bench` found faster for a whole run (`fastest_mode`), else eager.

    Why eager where nothing was measured: on a CPU compiling a ResNet-32's modules takes minutes for
    little gain, and on the one GPU measured so far (an H200) eager steps were faster for each of the three
    configurations timed in both modes, and spared 29 to 45 s of compiling a process; both compute the same
    numbers."""
    path = epoch_csv(bench, gpu) if gpu else None
    decided = fastest_mode(read_epoch_table(path)) if path and path.is_file() else None
    return decided or "eager"


def epoch_csv(bench: Path, gpu: str) -> Path:
    """The epoch benchmark's table of the GPU model `gpu` (a device slug, or a glob pattern)."""
    return bench / f"epoch-resnet32-{gpu}.csv"


def read_epoch_table(path: Path) -> pd.DataFrame:
    """An epoch benchmark's table, failed modes' rows kept (blank `epoch_seconds`), so that none is chosen."""
    return read_table(path, "delete it to measure the epochs again", ("method", "K", "mode", "precision"),
                      may_be_blank=("epoch_seconds",))


def fastest_mode(table: pd.DataFrame, epochs: int = RUN_EPOCHS) -> str | None:
    """The step mode in which a process training `epochs` epochs takes least time, summed over the fp32
    methods measured in every mode: `epochs` times the pace plus the first epoch's extra time
    (`compile_seconds`, where recorded). This is the mode a grid trains in, and `auto`'s, on that GPU. A
    mode that failed on any method is never chosen: when one mode is left, it is the answer. None when
    nothing decides yet (fewer than two modes with a common method measured).

    Why the compile time counts: every training process compiles its modules again (a lease's
    machine starts without inductor's cache), and on an H200 that took 29 to 45 s, against 0.9 s an
    epoch; a pace alone would pick a mode that loses its gain in compiling."""
    fp32 = table[table["precision"] == "fp32"]
    failed = fp32.loc[fp32["epoch_seconds"].isna(), "mode"]
    fp32 = fp32[~fp32["mode"].isin(failed)]
    if len(failed) and fp32["mode"].nunique() == 1:
        return str(fp32["mode"].iloc[0])
    first = fp32["compile_seconds"].fillna(0.0) if "compile_seconds" in fp32 else 0.0
    process = fp32.assign(process_seconds=fp32["epoch_seconds"] * epochs + first)
    common = process.pivot_table(index=["method", "K"], columns="mode", values="process_seconds").dropna()
    if common.empty or common.shape[1] < 2:
        return None
    return str(common.sum().idxmin())


def compile_modules(modules: list, backend: str = "inductor") -> list:
    """Each local module under `torch.compile`, for `train_step(modules=...)`: the same parameters and math.

    Inductor fuses each module's BatchNorm, ReLU, residual adds and its objective's pointwise work
    into fewer kernels, forward and backward; it keeps fp32 (TF32 where the eager step uses it),
    so the numbers move only by the order of floating-point sums (tests/test_step_modes.py states
    by how much). A module is one graph per batch shape (`dynamic=False`: a batch of another shape
    gets its own graph instead of turning every graph dynamic; the training loop sends only whole
    batches, `OneProcess.modules_for`), and the whole module must compile (`fullgraph`). All
    modules run the code of `LocalModule.forward`, and dynamo counts graphs per code object: the
    limit is raised to two graphs per module, and a run that would exceed it fails instead of
    falling back to eager in silence.
    """
    import torch._dynamo  # here, not at the top: it takes 2 s to import, and eager steps never need it

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 2 * len(modules) + 2)
    config.fail_on_recompile_limit_hit = True
    return [torch.compile(module, fullgraph=True, dynamic=False, backend=backend) for module in modules]
