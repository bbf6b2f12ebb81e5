"""Finished runs as data: their records, their trained networks and the exact data they saw."""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from infopro.config import TrainConfig, build_net
from infopro.data import Dataset, load_dataset
from infopro.errors import DataError, InfoProError
from infopro.local import LocalNet
from infopro.records import load_torch, read_json, read_table


@dataclass(frozen=True)
class Run:
    """A finished run directory: config.json and summary.json (model.pt may be left out)."""

    path: Path
    record: dict
    summary: dict

    @property
    def config(self) -> TrainConfig:
        return TrainConfig.from_dict(self.record["config"])

    @property
    def run_id(self) -> str:
        return self.record["run_id"]

    @property
    def module_ends(self) -> list[int]:
        return self.record["resolved"]["module_ends"]

    @property
    def has_weights(self) -> bool:
        return (self.path / "model.pt").exists()

    def load_net(self, device="cpu") -> LocalNet:
        """The trained network in eval mode (BN uses its running statistics)."""
        if not self.has_weights:
            raise InfoProError(f"{self.path} has no model.pt (git's tree keeps the weights of the paper recipe's "
                               "seed 0, see .gitignore; the CPU-trained ones come back with make cpu-weights; "
                               "rebuild others with "
                               f"python -m experiments.retrain {self.path} --restore-weights)")
        net = build_net(self.config)
        state = load_torch(self.path / "model.pt", "restore it from git or train the run again")
        try:
            net.load_state_dict(state)
        except (RuntimeError, TypeError, AttributeError):
            raise DataError(f"{self.path / 'model.pt'} does not hold this run's network (its tensors' names or "
                            "shapes differ from the network config.json describes)") from None
        return net.to(device).eval()

    def load_whole_data(self, data_root=None) -> Dataset:
        """The run's whole dataset (every image, also those outside its subsets), checked against the
        recorded fingerprint."""
        dataset = load_dataset(self.config.dataset, data_root)
        if dataset.fingerprint != self.record["dataset"]["fingerprint"]:
            raise DataError(f"{dataset.source} differs from the data {self.run_id} was trained on "
                            f"(fingerprint {dataset.fingerprint}, recorded {self.record['dataset']['fingerprint']})")
        return dataset

    def load_data(self, data_root=None) -> Dataset:
        """The run's dataset with its train/test subsets, checked against the recorded fingerprint."""
        dataset, config = self.load_whole_data(data_root), self.config
        return Dataset(dataset.name, dataset.train.subset(config.train_subset),
                       dataset.test.subset(config.test_subset), dataset.fingerprint, dataset.source)

    def row(self) -> dict:
        """One flat record describing the run, for joining with analysis results."""
        return run_description(self.record)


def run_description(record: dict) -> dict:
    """One flat record describing a run, finished or not, from its config.json: what the analyses,
    figures and tables group by and state. `epochs` is the schedule's length, not the epochs done."""
    config, provenance = TrainConfig.from_dict(record["config"]), record["provenance"]
    return {
        "run_id": record["run_id"], "dataset": config.dataset, "arch": config.arch, "regime": config.regime,
        "task_loss": config.task_loss or "", "K": config.K, "split": config.split, "seed": config.seed,
        "recipe": recipe_label(record), "epochs": config.epochs,
        "train_images": record["dataset"]["train_size"], "test_images": record["dataset"]["test_size"],
        "run_commit": provenance["git_commit"], "run_device": provenance["device_name"],
        "precision": config.precision,
    }


def recipe_label(record: dict) -> str:
    """Human-readable training recipe: what a figure must state about the runs it shows."""
    config, data = record["config"], record["dataset"]
    epochs = config["epochs"]
    return (f"{data['name']}, {data['train_size']:,} train / {data['test_size']:,} test images, "
            f"{epochs} epoch{'s' if epochs != 1 else ''}, batch {config['batch_size']}")


def read_metrics(run, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """A run directory's metrics.csv, finished or not (one row per epoch done); damaged, or
    without `columns`, it is one line saying how to make it again."""
    return read_table(Path(run) / "metrics.csv", "resume the run (experiments.train --resume) or train it again",
                      columns)


def last_epoch_images_per_second(run) -> float:
    """Training images/s of a run directory's last epoch (finished or not): its steady speed."""
    metrics = read_metrics(run, ("epoch_seconds",))
    images = read_json(Path(run) / "config.json")["dataset"]["train_size"]
    return images / metrics["epoch_seconds"].iloc[-1]


# What the analyses, figures and tables read of a finished run's config.json and summary.json.
RECORD_KEYS = ("run_id", "config", "resolved", "dataset", "provenance")
SUMMARY_KEYS = ("final_test_error", "epochs")


def load_run(path) -> Run:
    """The finished run in directory `path`."""
    path = Path(path)
    if not (path / "config.json").is_file() or not (path / "summary.json").is_file():
        raise InfoProError(f"{path} is not a finished run directory (it needs config.json and summary.json)")
    return Run(path, read_json(path / "config.json", RECORD_KEYS), read_json(path / "summary.json", SUMMARY_KEYS))


def find_runs(root, readable=lambda path: True) -> list[Run]:
    """Every finished run below `root`, sorted by run id. A run whose records cannot be read is one
    line naming its file, unless `readable(its folder)` says it may be left out."""
    runs = []
    for summary in Path(root).glob("**/summary.json"):
        if (summary.parent / "config.json").exists():
            try:
                runs.append(load_run(summary.parent))
            except DataError:
                if readable(summary.parent):
                    raise
    return sorted(runs, key=lambda run: run.run_id)


def select_by_run_id(items: list, only: list[str] | None, run_id, what: str) -> list:
    """The items whose `run_id(item)` contains one of the `only` substrings (all when `only` is
    empty): how the analyses and the grid runner are told to work on part of their runs."""
    if not only:
        return items
    chosen = [item for item in items if any(part in run_id(item) for part in only)]
    if not chosen:
        raise InfoProError(f"no {what} matches {', '.join(only)}")
    return chosen


def finished_runs(root, only: list[str] | None = None) -> list[Run]:
    """The finished runs below `root` whose id contains one of the `only` substrings (all when
    `only` is empty): what an analysis works on. A missing folder, or one without a finished
    run, is an error rather than an empty analysis, so a mistyped --runs cannot pass silently."""
    if not Path(root).is_dir():
        raise InfoProError(f"{root}: no such folder of runs")
    # A damaged run is left out of a selection its folder's name is not in (run ids are folder names).
    runs = find_runs(root, lambda path: not only or any(part in path.name for part in only))
    if not runs:
        raise InfoProError(f"no finished run under {root}")
    return select_by_run_id(runs, only, lambda run: run.run_id, "finished run")


CURVE_COLUMNS = ("epoch", "lr", "train_error", "test_error")  # what a training curve reads of metrics.csv


def training_curves(root) -> pd.DataFrame:
    """One row per epoch of every run below `root`, finished or not: the run's description, the
    epoch's learning rate, train and test error, and `finished` (summary.json written). Unfinished
    runs are what a grid between GPU calls mostly holds; their curves show where each stands."""
    frames = []
    for record_path in sorted(Path(root).glob("**/config.json")):
        folder = record_path.parent
        if not (folder / "metrics.csv").is_file():
            continue
        metrics = read_metrics(folder, CURVE_COLUMNS)
        frames.append(metrics[list(CURVE_COLUMNS)].assign(**run_description(read_json(record_path, RECORD_KEYS)),
                                                           finished=(folder / "summary.json").is_file()))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def runs_table(root) -> pd.DataFrame:
    """One row per finished run: its description and its summary's numbers (the per-image
    `final_test_correct` is left to infopro.paired)."""
    rows = [run.row() | {key: value for key, value in run.summary.items() if key != "final_test_correct"}
            for run in find_runs(root)]
    return pd.DataFrame(rows)


def schedule_pairs(runs: list[Run], longer: list[Run]) -> pd.DataFrame:
    """Each run of `longer` beside the run of `runs` with the same config but fewer epochs.

    Everything but the epoch count must match (seed, subsets, λs and warm-up included), so the
    difference between the two is the schedule's alone. One row per pair: the longer run's
    description, both epoch counts and both runs' final train and test errors.
    """
    def all_but_epochs(run: Run) -> tuple:
        return tuple((name, value) for name, value in run.config.__dict__.items() if name != "epochs")

    shorter: dict = {}
    for run in runs:
        shorter.setdefault(all_but_epochs(run), []).append(run)
    rows = []
    for run in longer:
        for short in shorter.get(all_but_epochs(run), []):
            if short.config.epochs < run.config.epochs:
                rows.append(run.row() | {
                    "batch_size": run.config.batch_size,
                    "epochs_short": short.config.epochs, "epochs_long": run.config.epochs,
                    "test_error_short": short.summary["final_test_error"],
                    "test_error_long": run.summary["final_test_error"],
                    "train_error_short": short.summary["final_train_error"],
                    "train_error_long": run.summary["final_train_error"]})
    return pd.DataFrame(rows)
