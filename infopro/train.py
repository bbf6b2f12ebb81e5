"""Training E2E, greedy SL and InfoPro with the paper's recipe; resumable run directories.

One step (`train_step`): module k runs on the detached output of module k-1, its local loss
is back-propagated at once (freeing its graph), and its output is detached, so no gradient
crosses a module boundary and only one module's activations are alive at a time. A single
SGD step then updates every module ("simultaneous" training, as the paper's code).

A run directory holds `config.json` (resolved config + provenance), `metrics.csv` (one row
per epoch), `checkpoint.pt` (while unfinished), and at the end `model.pt` and `summary.json`.
All files are written atomically, by one process at a time (it locks the directory);
`resume=True` continues after the last completed epoch and ends with the same metrics as an
uninterrupted run (CPU, same seed).
"""

import fcntl
import math
import os
import sys
import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from infopro.data import DATASETS, Split, augmented_batch, load_dataset, normalise, shuffled_batches, to_unit
from infopro.errors import DataError, DivergedError, InfoProError, RunDirError
from infopro.local import (REGIMES, TASK_LOSSES, LocalModule, LocalNet, build_local_net, check_e2e_is_one_module,
                           rows_per_batch, run_layers)
from infopro.memory import SavedActivations, cuda_peak
from infopro.models import ARCHS
from infopro.records import encode_correct, load_torch, provenance, read_json, save_torch, write_csv, write_json
from infopro.splits import LossWeights, loss_weights, module_ends

PRECISIONS = ("fp32", "bf16")
WARMUP_START_LR = 0.01
EVAL_BATCH = 1000


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run's result; defaults are the paper's CIFAR-10 recipe.

    K: number of gradient-isolated local modules (1 = end-to-end).
    split: "paper" (equal depth), "balanced" (InfoPro*, equal memory) or layer points "4,8,12".
    lambda1, lambda2: (first, last) weights of the reconstruction term (I(h,x)) and of the task
        term (I(h,y)) across the K-1 local modules, interpolated linearly; None = paper's table.
    warmup_epochs: epochs of the linear blend from lr 0.01 into the cosine schedule (paper: 10).
    train_subset, test_subset: use the first N images of a fixed permutation (None = all).
    """

    arch: str = "resnet32"
    regime: str = "e2e"
    K: int = 1
    task_loss: str | None = "contrast"
    split: str = "paper"
    lambda1: tuple[float, float] | None = None
    lambda2: tuple[float, float] | None = None
    dataset: str = "cifar10"
    train_subset: int | None = None
    test_subset: int | None = None
    epochs: int = 160
    batch_size: int = 1024
    lr: float = 0.8
    warmup_epochs: int = 10
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    precision: str = "fp32"

    def __post_init__(self):
        for name, valid in (("arch", ARCHS), ("regime", REGIMES), ("dataset", DATASETS),
                            ("precision", PRECISIONS)):
            if getattr(self, name) not in valid:
                raise InfoProError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
        if self.regime == "infopro" and self.task_loss not in TASK_LOSSES:
            raise InfoProError(f"unknown task loss {self.task_loss!r}; valid: {', '.join(TASK_LOSSES)}")
        if self.regime != "infopro":  # these fields mean nothing outside InfoPro: keep them out of the identity
            for name in ("task_loss", "lambda1", "lambda2"):
                object.__setattr__(self, name, None)
        for name in ("lambda1", "lambda2"):
            if getattr(self, name) is not None:
                weights = tuple(float(v) for v in getattr(self, name))
                if not all(0 <= w < math.inf for w in weights):  # a negative weight ascends its loss
                    raise InfoProError(f"--{name} weights must be finite and 0 or more, got {weights}")
                object.__setattr__(self, name, weights)
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise InfoProError(f"--{name.replace('_', '-')} must be at least 1")
        if self.warmup_epochs < 0:
            raise InfoProError("--warmup-epochs must be 0 or more")
        if not 0 < self.lr < math.inf:
            raise InfoProError(f"--lr must be positive and finite, got {self.lr}")
        if self.seed < 0:  # torch's generators take no negative seed
            raise InfoProError(f"--seed must be 0 or more, got {self.seed}")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Build from a dict (e.g. a config.json), refusing keys this version does not know."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InfoProError(f"unknown config keys: {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**values)

    def module_ends(self) -> list[int]:
        check_e2e_is_one_module(self.regime, self.K)
        return module_ends(self.arch, self.K, self.split)

    def loss_weights(self) -> LossWeights:
        if self.regime != "infopro":
            return LossWeights((), ())
        return loss_weights(self.arch, self.K, self.split, self.lambda1, self.lambda2)

    def resolved(self) -> dict:
        """The module ends and per-module λ1, λ2 it trains with; refuses a K the split cannot give."""
        ends, weights = self.module_ends(), self.loss_weights()
        return {"module_ends": ends, "lambda1": list(weights.lambda1), "lambda2": list(weights.lambda2)}

    def run_id(self) -> str:
        """Directory name from the content: dataset, arch, regime, K, split, recipe, seed.

        The recipe tag lists what differs from the paper's recipe (n = train images, e = epochs,
        b = batch size, bf16), so a short CPU run never shares a name with a paper-recipe run.
        """
        regime = f"infopro-{self.task_loss}" if self.regime == "infopro" else self.regime
        split = "" if self.split == "paper" or self.K == 1 else f"-{self.split.replace(',', '_')}"
        paper = TrainConfig()
        recipe = "".join(f"-{tag}{getattr(self, name)}" for tag, name in
                         (("n", "train_subset"), ("e", "epochs"), ("b", "batch_size"))
                         if getattr(self, name) != getattr(paper, name))
        recipe += "-bf16" if self.precision == "bf16" else ""
        return f"{self.dataset}-{self.arch}-{regime}-K{self.K}{split}{recipe}-s{self.seed}"


def build_net(config: TrainConfig) -> LocalNet:
    """The local network of `config`, initialised from its seed."""
    torch.manual_seed(config.seed)
    return build_local_net(config.arch, config.regime, config.module_ends(), config.loss_weights(),
                           config.task_loss or "contrast")


def learning_rate(config: TrainConfig, epoch: int) -> float:
    """Learning rate of epoch `epoch` (1-based), set once per epoch as the paper's `--cos_lr`.

    Cosine decay lr0 * (1 + cos(pi * e / E)) / 2; during the first W warm-up epochs it is
    blended linearly with 0.01: weight (e-1)/W on the cosine value, (W+1-e)/W on 0.01.
    """
    cosine = 0.5 * config.lr * (1 + math.cos(math.pi * epoch / config.epochs))
    warmup = config.warmup_epochs
    if epoch > warmup:
        return cosine
    return cosine * (epoch - 1) / warmup + WARMUP_START_LR * (warmup + 1 - epoch) / warmup


def epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    """Data order and augmentation of one epoch, a function of (seed, epoch) only.

    Re-seeding per epoch instead of saving generator state is what makes a resumed run
    draw exactly the batches the uninterrupted run would have drawn.
    """
    state = int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator(device=device).manual_seed(state)


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def prepare_input(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Normalised network input; channels-last on CUDA, where cuDNN's convolutions prefer it."""
    x = normalise(x)
    return x.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x


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


def resolve_device(name: str, remedy: str = "use --device cpu or auto") -> torch.device:
    """The torch device `name` (auto, cpu, cuda) names; `remedy` is what the refusal of a missing
    CUDA device tells to do, since which options exist depends on the command."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise InfoProError(f"unknown device {name!r}; valid: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise InfoProError(f"no CUDA device is available; {remedy}")
    return torch.device(name)


def configure_backends(device: torch.device) -> None:
    """cuDNN autotuning and TF32 on CUDA (both recorded in the provenance); nothing on CPU."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


class RunDir:
    """A run's directory: refuses a different run, resumes the same one, writes atomically."""

    def __init__(self, path, record: dict):
        self.path = Path(path)
        self.record = record
        self.release = lambda: None

    def identity(self, record: dict) -> tuple:
        return record["config"], record["dataset"]["fingerprint"]

    def open(self, resume: bool) -> dict | None:
        """Return the checkpoint to resume from (None to start afresh); refuse a mismatch or a run in use."""
        self.claim()
        try:
            return self.checkpoint_to_resume(resume)
        except BaseException:
            self.release()
            raise

    def claim(self) -> None:
        """Lock the directory for this process until the RunDir is released, collected or the process ends.

        Two trainings of one run (a grid started twice, a detached job launched again) would
        interleave their checkpoints and metrics. The OS drops the lock with the process, so a
        killed run leaves nothing stale behind.
        """
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"{self.path} is a file, not a run directory; choose another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_RDONLY)
        self.release = weakref.finalize(self, os.close, descriptor)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise RunDirError(f"{self.path} is being trained by another process; "
                              f"wait for it to end, or choose another --out") from None

    def checkpoint_to_resume(self, resume: bool) -> dict | None:
        config_file = self.path / "config.json"
        if not config_file.exists():
            if any(self.path.iterdir()):  # `claim` made sure the folder exists
                raise RunDirError(f"{self.path} exists and is not a run directory; choose another --out")
            write_json(config_file, self.record)
            return None
        stored = read_json(config_file)
        if self.identity(stored) != self.identity(self.record):
            differences = differing_keys(stored, self.record)
            raise RunDirError(f"{self.path} holds a different run (differs in: {differences}); "
                              f"choose another --out")
        if not resume:
            raise RunDirError(f"{self.path} already holds this run; pass --resume to continue it")
        checkpoint = self.path / "checkpoint.pt"
        if not checkpoint.exists():
            self.check_nothing_to_lose()
            return None
        state = load_torch(checkpoint, "delete it to train the run again from its first epoch")
        # Epochs after this point ran on this machine and software: say so beside the first.
        stored.setdefault("resumed", []).append(self.record["provenance"])
        write_json(config_file, stored)
        return state

    def check_nothing_to_lose(self) -> None:
        """Refuse to train from epoch 1 over a run that trained before: without its checkpoint and its
        summary, a finished run whose summary.json was lost would otherwise be trained again in silence."""
        if self.finished:
            return
        trained = [name for name in ("model.pt", "metrics.csv") if (self.path / name).exists()]
        if trained:
            raise RunDirError(f"{self.path} holds {' and '.join(trained)} but neither summary.json nor checkpoint.pt; "
                              "restore them from git, or delete the directory to train the run again")

    @property
    def finished(self) -> bool:
        return (self.path / "summary.json").exists()

    def save_epoch(self, model_state: dict, optimizer_state: dict, epoch: int, metrics: list[dict]) -> None:
        write_csv(self.path / "metrics.csv", metrics)
        save_torch(self.path / "checkpoint.pt", {"epoch": epoch, "model": model_state,
                                                 "optimizer": optimizer_state, "metrics": metrics})

    def finish(self, model_state: dict, summary: dict) -> None:
        save_torch(self.path / "model.pt", model_state)
        write_json(self.path / "summary.json", summary)
        (self.path / "checkpoint.pt").unlink(missing_ok=True)


def differing_keys(stored: dict, current: dict) -> str:
    keys = [key for key in current["config"] if stored["config"].get(key) != current["config"][key]]
    if stored["dataset"]["fingerprint"] != current["dataset"]["fingerprint"]:
        keys.append("dataset fingerprint")
    return ", ".join(f"{key} {stored['config'].get(key)!r} -> {current['config'].get(key)!r}"
                     if key in current["config"] else key for key in keys)


def run_record(config: TrainConfig, dataset, train: Split, test: Split, device: torch.device) -> dict:
    """The contents of config.json: config, resolved split and λs, data identity, provenance."""
    return {
        "run_id": config.run_id(),
        "config": asdict(config),
        "resolved": config.resolved(),
        "dataset": {"name": dataset.name, "fingerprint": dataset.fingerprint, "source": dataset.source,
                    "train_size": len(train), "test_size": len(test)},
        "provenance": provenance(device) | {"precision": config.precision},
    }


class Progress:
    """A one-line progress bar on a terminal; silent otherwise (logs stay one line per epoch)."""

    def __init__(self, total: int, label: str, enabled: bool = True):
        self.total, self.label = total, label
        self.enabled = enabled and sys.stderr.isatty()

    def update(self, done: int) -> None:
        if self.enabled:
            filled = 30 * done // self.total
            print(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total}",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled:
            print("\r" + " " * (len(self.label) + 45) + "\r", end="", file=sys.stderr, flush=True)


@dataclass
class OpenedRun:
    """A run directory opened for training, with its data and the checkpoint to resume from.

    `run` is None in a data-parallel rank other than 0: it trains but never writes.
    """

    run: "RunDir | None"
    train: Split
    test: Split
    checkpoint: dict | None
    finished: bool


def load_splits(config: TrainConfig, device: torch.device, data_root=None, download: bool = False):
    """(dataset, train split, test split) of `config`, the splits on `device`."""
    dataset = load_dataset(config.dataset, data_root, download)
    return dataset, *(subset_of(split, n, name, dataset.name).to(device) for split, n, name in
                      ((dataset.train, config.train_subset, "train"), (dataset.test, config.test_subset, "test")))


def subset_of(split: Split, n: int | None, name: str, dataset: str) -> Split:
    """`split.subset(n)`, refusing an `n` beyond the split: the run would use every image while its
    name and config say n (`-n60000` on CIFAR-10's 50,000)."""
    if n is not None and n > len(split):
        raise DataError(f"--{name}-subset {n} exceeds the {len(split):,} {name} images of {dataset}; "
                        f"give at most {len(split)}, or leave it out to use them all")
    return split.subset(n)


def check_batches(config: TrainConfig, train_size: int, ranks: int = 1) -> None:
    """Every batch of an epoch, the last included, must give each of `ranks` data-parallel processes
    a row, and hold the rows the regime's batch normalisation needs (two under DGL: its BatchNorm1d
    cannot normalise one sample; data-parallel BatchNorm takes the whole batch's statistics)."""
    smallest = train_size % config.batch_size or config.batch_size
    rows = rows_per_batch(config.regime)
    if smallest < max(rows, ranks):
        holds = f"{smallest} image{'s' * (smallest > 1)} ({train_size} mod {config.batch_size})"
        need = f"the {ranks} ranks" if ranks >= rows else f"the {rows} that {config.regime}'s batch normalisation needs"
        raise InfoProError(f"the last batch of each epoch holds {holds}, fewer than {need}; "
                           f"change --batch-size or --train-subset")


def open_run(config: TrainConfig, out, data, device: torch.device, resume: bool = False,
             extra_record: dict | None = None, ranks: int = 1) -> OpenedRun:
    """Open (or refuse) the run directory `out` of `config` trained on `data` (from `load_splits`)
    by `ranks` data-parallel processes."""
    dataset, train_split, test_split = data
    check_batches(config, len(train_split), ranks)
    record = run_record(config, dataset, train_split, test_split, device) | (extra_record or {})
    run = RunDir(out, record)
    checkpoint = run.open(resume)
    return OpenedRun(run, train_split, test_split, None if run.finished else checkpoint, run.finished)


class OneProcess:
    """This process trains on every whole batch by itself: how `train` runs unless told otherwise.

    `infopro.data_parallel.DataParallel` is the other case (one shard of each batch per rank);
    `train` asks either one where the data comes from, which rows of a batch are its own, how
    to add up over ranks, and whether it is the process that writes.
    """

    writer = True   # evaluates, writes the run directory and logs
    modules = None  # the local modules train_step runs (None: the network's own)
    row: dict = {}  # extra columns of metrics.csv

    def __init__(self, device: torch.device):
        self.device = device

    def open_run(self, config: TrainConfig, out, data_root, download: bool, resume: bool) -> OpenedRun:
        return open_run(config, out, load_splits(config, self.device, data_root, download), self.device, resume)

    def wrap(self, net: LocalNet) -> None:
        """Nothing to do: the network trains as it is."""

    def share(self, batch_size: int) -> tuple[slice, float]:
        """This process's rows of a batch and the weight of its mean losses: all of it, 1."""
        return slice(None), 1.0

    def total(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def agree(self, value):
        return value


def train_epoch(net, optimizer, train: Split, config: TrainConfig, epoch: int, measure: dict | None = None,
                replicas: OneProcess | None = None):
    """One pass over `train`; returns this process's summed module losses and misclassified count (on device).

    Every process draws the whole batch (same generator: same order and augmentation as one
    process would) and trains on its share. When `measure` is a dict, the first step's peak
    saved-activation bytes are put in it.
    """
    device = train.images.device
    replicas = replicas or OneProcess(device)
    generator = epoch_generator(config.seed, epoch, device)
    batches = shuffled_batches(len(train), config.batch_size, generator)
    loss_sums = torch.zeros(net.K, device=device)
    wrong = torch.zeros((), dtype=torch.long, device=device)
    progress = Progress(len(batches), f"epoch {epoch}", replicas.writer)
    for step, index in enumerate(batches):
        rows, loss_scale = replicas.share(len(index))
        x = augmented_batch(train.images[index], generator)[rows]
        y = train.labels[index][rows]
        optimizer.zero_grad(set_to_none=True)
        with SavedActivations() if measure is not None and step == 0 else nullcontext() as saved:
            losses, batch_wrong = train_step(net, x, y, config.precision, modules=replicas.modules,
                                             loss_scale=loss_scale)
        if saved is not None:
            measure["peak_saved_activation_bytes"] = saved.peak_bytes
        optimizer.step()
        loss_sums += losses * len(y)
        wrong += batch_wrong
        progress.update(step + 1)
    progress.close()
    return loss_sums, wrong


def sgd(parameters, config: TrainConfig) -> torch.optim.SGD:
    """The paper's optimizer: SGD, Nesterov momentum, weight decay on every parameter."""
    return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, nesterov=True,
                           weight_decay=config.weight_decay)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def place(net: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Move to `device`; channels-last on CUDA, where cuDNN's convolutions prefer it."""
    net = net.to(device)
    return net.to(memory_format=torch.channels_last) if device.type == "cuda" else net


def check_finite(losses: list[float], epoch: int, run: "RunDir") -> None:
    if not all(math.isfinite(v) for v in losses):
        kept = f"keeps the checkpoint of epoch {epoch - 1}" if epoch > 1 else "has no checkpoint yet"
        raise DivergedError(f"non-finite loss in epoch {epoch} (module losses {losses}); {run.path} {kept}")


def epoch_row(epoch: int, lr: float, losses: list[float], train_error: float, test_error: float,
              seconds: float) -> dict:
    """One line of metrics.csv."""
    return {"epoch": epoch, "lr": lr, **{f"loss_m{k + 1}": v for k, v in enumerate(losses)},
            "train_error": train_error, "test_error": test_error, "epoch_seconds": seconds}


class EpochBudget:
    """When to stop a call early: after epoch `stop_after_epoch`, after an epoch for which
    `stop_when(epoch)` holds, or before overrunning `seconds`."""

    def __init__(self, stop_after_epoch: int | None = None, seconds: float | None = None,
                 stop_when: Callable[[int], bool] | None = None):
        self.stop_after_epoch = stop_after_epoch
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.stop_when = stop_when

    def stop_after(self, epoch: int, epochs: int, epoch_seconds: float) -> bool:
        """True if the call should end after `epoch`, judging the next epoch by this one's length."""
        if epoch >= epochs:
            return False
        if self.stop_after_epoch is not None and epoch >= self.stop_after_epoch:
            return True
        if self.stop_when is not None and self.stop_when(epoch):
            return True
        return self.deadline is not None and time.monotonic() + epoch_seconds > self.deadline


def train(config: TrainConfig, out, *, device: str = "auto", data_root=None, download: bool = False,
          resume: bool = False, stop_after_epoch: int | None = None, time_budget: float | None = None,
          stop_when: Callable[[int], bool] | None = None, log=print,
          replicas: OneProcess | None = None) -> dict | None:
    """Train `config` into directory `out`; return the summary, or None if stopped early.

    Stopping early leaves a resumable run: `stop_after_epoch` ends this call after that
    epoch; `time_budget` (seconds) ends it after the last epoch that is expected to finish
    within the budget, judged by the duration of the epoch before; `stop_when(epoch)`, asked
    once the epoch is written, ends it when true (a replay that has parted from its record).
    By default this process trains alone on `device`; with `replicas` =
    `infopro.data_parallel.DataParallel` it is one rank of a data-parallel job, and only rank 0
    evaluates, writes, logs and returns the summary. A non-finite loss or a failed write raises
    on rank 0, whose launcher then stops the ranks waiting for its word.
    """
    replicas = replicas or OneProcess(resolve_device(device))
    budget = EpochBudget(stop_after_epoch, time_budget, stop_when)
    configure_backends(replicas.device)
    opened = replicas.open_run(config, out, data_root, download, resume)
    if opened is None:  # rank 0 could not open the run, and says why
        return None
    try:
        return train_opened(config, out, opened, replicas, budget, log if replicas.writer else (lambda line: None))
    finally:
        if opened.run is not None:
            opened.run.release()


def train_opened(config: TrainConfig, out, opened: OpenedRun, replicas: OneProcess, budget: EpochBudget,
                 log) -> dict | None:
    """`train` once its run directory is open (and locked by the writing process)."""
    if opened.finished:
        log(f"{out}: already complete ({config.epochs} epochs)")
        return read_json(Path(out) / "summary.json") if replicas.writer else None
    net = place(build_net(config), replicas.device)
    replicas.wrap(net)
    optimizer = sgd(net.parameters(), config)
    metrics, start = [], 1
    if opened.checkpoint is not None:
        net.load_state_dict(opened.checkpoint["model"])
        optimizer.load_state_dict(opened.checkpoint["optimizer"])
        metrics, start = opened.checkpoint["metrics"], opened.checkpoint["epoch"] + 1
        log(f"resuming {out} after epoch {opened.checkpoint['epoch']}")

    measured, memory = {}, {}
    n = len(opened.train)
    for epoch in range(start, config.epochs + 1):
        lr = learning_rate(config, epoch)
        set_learning_rate(optimizer, lr)
        began = time.perf_counter()
        # CUDA peaks are taken after the first epoch of this call (cuDNN autotuning, warm-up).
        with cuda_peak(replicas.device, memory if epoch > start or epoch == config.epochs else {}):
            loss_sums, wrong = train_epoch(net, optimizer, opened.train, config, epoch,
                                           measured if epoch == start else None, replicas)
            losses = (replicas.total(loss_sums) / n).tolist()
            train_error = 100.0 * replicas.total(wrong).item() / n
        seconds = time.perf_counter() - began
        stop = None
        if replicas.writer:
            check_finite(losses, epoch, opened.run)
            row = epoch_row(epoch, lr, losses, train_error, evaluate(net, opened.test, config.precision),
                            seconds) | replicas.row
            metrics.append(row)
            opened.run.save_epoch(net.state_dict(), optimizer.state_dict(), epoch, metrics)
            log(epoch_line(row, config.epochs, n))
            stop = budget.stop_after(epoch, config.epochs, time.perf_counter() - began)
        if replicas.agree(stop):
            log(f"stopped after epoch {epoch}/{config.epochs}; continue with --resume")
            return None

    if not replicas.writer:
        return None
    summary = summarise(metrics, n, measured, memory, opened.train.nbytes + opened.test.nbytes,
                        correct_per_image(net, opened.test, config.precision))
    opened.run.finish(net.state_dict(), summary)
    return summary


def epoch_line(row: dict, epochs: int, images: int) -> str:
    losses = " ".join(f"{value:.3f}" for key, value in row.items() if key.startswith("loss_m"))
    return (f"epoch {row['epoch']}/{epochs}  lr {row['lr']:.4f}  loss {losses}  "
            f"train {row['train_error']:.2f}%  test {row['test_error']:.2f}%  "
            f"{row['epoch_seconds']:.1f}s ({images / row['epoch_seconds']:.0f} img/s)")


def summarise(metrics: list[dict], train_size: int, measured: dict, memory: dict, data_bytes: int,
              final_correct: torch.Tensor) -> dict:
    """summary.json: the headline is the final epoch's test error (never a best epoch).

    `final_correct` (right or wrong per test image of the final network) is kept as well, so that
    two runs can be compared image by image (infopro.paired) also where git keeps no weights.
    """
    train_seconds = sum(row["epoch_seconds"] for row in metrics)
    return {
        "final_test_error": metrics[-1]["test_error"],
        "final_train_error": metrics[-1]["train_error"],
        "epochs": len(metrics),
        "train_seconds": train_seconds,
        "images_per_second": train_size * len(metrics) / train_seconds,
        "peak_saved_activation_bytes": measured.get("peak_saved_activation_bytes"),
        "peak_cuda_allocated_bytes": memory.get("peak_cuda_allocated_bytes"),
        "peak_cuda_reserved_bytes": memory.get("peak_cuda_reserved_bytes"),
        "resident_dataset_bytes": data_bytes,
        "final_test_correct": encode_correct(final_correct.cpu().numpy()),
    }
