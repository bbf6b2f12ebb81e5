"""Training E2E, greedy SL and InfoPro with the paper's recipe; resumable run directories.

The epoch loop over `infopro.step.train_step`, into a run directory (`infopro.rundir`):
`resume=True` continues after the last completed epoch and ends with the same metrics as an
uninterrupted run (CPU, same seed).
"""

import math
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

from infopro.augment import augmented_batch, shuffled_batches
from infopro.config import TrainConfig, build_net, epoch_generator, learning_rate, set_learning_rate, sgd
from infopro.data import Split
from infopro.device import configure_backends, place, resolve_device
from infopro.errors import DivergedError
from infopro.local import LocalNet
from infopro.memory import SavedActivations, cuda_peak
from infopro.records import encode_correct, read_json
from infopro.rundir import OpenedRun, RunDir, load_splits, open_run
from infopro.step import compile_modules, correct_per_image, evaluate, resolve_step_mode, train_step


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


class OneProcess:
    """This process trains on every whole batch by itself: how `train` runs unless told otherwise.

    `infopro.data_parallel.DataParallel` is the other case (one shard of each batch per rank);
    `train` asks either one where the data comes from, which rows of a batch are its own, how
    to add up over ranks, and whether it is the process that writes.
    """

    writer = True    # evaluates, writes the run directory and logs
    modules = None   # the local modules train_step runs (None: the network's own)
    compiled = None  # their compiled twins, for whole batches (the compiled step mode)
    row: dict = {}   # extra columns of metrics.csv

    def __init__(self, device: torch.device, step_mode: str = "eager"):
        self.device, self.step_mode = device, step_mode  # step_mode: eager, or compiled (`wrap`)

    def open_run(self, config: TrainConfig, out, data_root, download: bool, resume: bool) -> OpenedRun:
        return open_run(config, out, load_splits(config, self.device, data_root, download), self.device, resume,
                        step_mode=self.step_mode)

    def wrap(self, net: LocalNet) -> None:
        """Compile the local modules in the compiled step mode; else the network trains as it is."""
        if self.step_mode == "compiled":
            self.compiled = compile_modules(net.local_modules)

    def modules_for(self, rows: int, batch_size: int):
        """The local modules a batch of `rows` rows runs through. Compiled modules take whole batches only:
        the epoch's last, smaller batch (848 of the paper's 50,000 images) steps eagerly, in the same math
        to within the compiled mode's tolerance, rather than compiling every module a second time for
        its shape. Compiling is most of a compiled run's start-up (an InfoPro K = 16 ResNet-32's modules
        take minutes per batch shape), paid again by every process a lease starts."""
        return self.compiled if self.compiled is not None and rows == batch_size else self.modules

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
            losses, batch_wrong = train_step(net, x, y, config.precision,
                                             modules=replicas.modules_for(len(index), config.batch_size),
                                             loss_scale=loss_scale)
        if saved is not None:
            measure["peak_saved_activation_bytes"] = saved.peak_bytes
        optimizer.step()
        loss_sums += losses * len(y)
        wrong += batch_wrong
        progress.update(step + 1)
    progress.close()
    return loss_sums, wrong


def check_finite(losses: list[float], epoch: int, run: "RunDir") -> None:
    if not all(math.isfinite(v) for v in losses):
        kept = f"keeps the checkpoint of epoch {epoch - 1}" if epoch > 1 else "has no checkpoint yet"
        raise DivergedError(f"non-finite loss in epoch {epoch} (module losses {losses}); {run.path} {kept}")


def epoch_row(epoch: int, lr: float, losses: list[float], train_error: float, test_error: float,
              seconds: float, ended_at: float) -> dict:
    """One line of metrics.csv. `ended_at` (Unix time at the end of the epoch's training) puts the epoch on
    a clock that processes share: runs side by side can be timed over the windows they all trained in."""
    return {"epoch": epoch, "lr": lr, **{f"loss_m{k + 1}": v for k, v in enumerate(losses)},
            "train_error": train_error, "test_error": test_error, "epoch_seconds": seconds, "ended_at": ended_at}


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
          stop_when: Callable[[int], bool] | None = None, log=print, step_mode: str = "auto",
          replicas: OneProcess | None = None) -> dict | None:
    """Train `config` into directory `out`; return the summary, or None if stopped early.

    Stopping early leaves a resumable run: `stop_after_epoch` ends this call after that
    epoch; `time_budget` (seconds) ends it after the last epoch that is expected to finish
    within the budget, judged by the duration of the epoch before; `stop_when(epoch)`, asked
    once the epoch is written, ends it when true (a replay that has parted from its record).
    By default this process trains alone on `device`, its steps in `step_mode` (auto: the faster on
    this GPU model by its epoch benchmark, else eager; `infopro.step.resolve_step_mode`); with `replicas` =
    `infopro.data_parallel.DataParallel` it is one rank of a data-parallel job, and only rank 0
    evaluates, writes, logs and returns the summary. A non-finite loss or a failed write raises
    on rank 0, whose launcher then stops the ranks waiting for its word.
    """
    if replicas is None:
        where = resolve_device(device)
        replicas = OneProcess(where, resolve_step_mode(step_mode, where))
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
    metrics, start = restore_checkpoint(net, optimizer, opened.checkpoint)
    if start > 1:
        log(f"resuming {out} after epoch {start - 1}")
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
        seconds, ended_at = time.perf_counter() - began, time.time()
        stop = None
        if replicas.writer:
            check_finite(losses, epoch, opened.run)
            row = epoch_row(epoch, lr, losses, train_error, evaluate(net, opened.test, config.precision),
                            seconds, ended_at) | replicas.row
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


def restore_checkpoint(net: LocalNet, optimizer, checkpoint: dict | None) -> tuple[list, int]:
    """Load a checkpoint into the network and its optimizer: the metrics so far, the first epoch to train."""
    if checkpoint is None:
        return [], 1
    net.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["metrics"], checkpoint["epoch"] + 1


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
