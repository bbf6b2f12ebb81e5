"""A run's directory: its record, lock, checkpoints and the data it is opened with.

A run directory holds `config.json` (resolved config + provenance), `metrics.csv` (one row
per epoch), `checkpoint.pt` (while unfinished), and at the end `model.pt` and `summary.json`.
All files are written atomically, by one process at a time (it locks the directory);
resuming continues after the last completed epoch.
"""

import fcntl
import os
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from infopro.config import TrainConfig
from infopro.data import Split, load_dataset
from infopro.errors import DataError, InfoProError, RunDirError
from infopro.local import rows_per_batch
from infopro.records import load_torch, provenance, read_json, save_torch, write_csv, write_json


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


def run_record(config: TrainConfig, dataset, train: Split, test: Split, device: torch.device,
               step_mode: str = "eager") -> dict:
    """The contents of config.json: config, resolved split and λs, data identity, provenance (with how
    the steps ran: `infopro.step.resolve_step_mode`)."""
    return {
        "run_id": config.run_id(),
        "config": asdict(config),
        "resolved": config.resolved(),
        "dataset": {"name": dataset.name, "fingerprint": dataset.fingerprint, "source": dataset.source,
                    "train_size": len(train), "test_size": len(test)},
        "provenance": provenance(device) | {"precision": config.precision, "step_mode": step_mode},
    }


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
             extra_record: dict | None = None, ranks: int = 1, step_mode: str = "eager") -> OpenedRun:
    """Open (or refuse) the run directory `out` of `config` trained on `data` (from `load_splits`)
    by `ranks` data-parallel processes, whose steps run in `step_mode`."""
    dataset, train_split, test_split = data
    check_batches(config, len(train_split), ranks)
    record = run_record(config, dataset, train_split, test_split, device, step_mode) | (extra_record or {})
    run = RunDir(out, record)
    checkpoint = run.open(resume)
    return OpenedRun(run, train_split, test_split, None if run.finished else checkpoint, run.finished)
