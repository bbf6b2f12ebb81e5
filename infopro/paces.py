"""Seconds per epoch to plan GPU time with: a run's recent pace, and its share of a GPU it shared.

A grid trains several runs at once on one GPU, and they take turns on it: four runs sharing an
H100 took 4.0 to 4.6 s per E2E epoch each, against 1.02 s alone (results/NOTES.md). A run's
seconds per epoch are then no measure of the GPU time it needs; the GPU time of each moment, split
evenly among the epochs running at that moment, is. So an epoch's share is its training interval
(metrics.csv's `ended_at` and `epoch_seconds`), each moment of it divided by the number of epochs of
runs on the same GPU model running then. Epochs from before `ended_at` was recorded have no interval
and no share: their runs keep only wall-clock paces, beside an unrecorded number of other runs. Where
an epoch benchmark timed a configuration alone, its ratio to such paces of that configuration's runs
prices the paces of the others (`share_ratio`), and a plan that uses it says so.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infopro.config import TrainConfig
from infopro.records import read_json
from infopro.runs import read_metrics
from infopro.step import auto_step_mode, epoch_csv, read_epoch_table

RECENT_EPOCHS = 10  # the epochs whose median sets a run's pace (`recent_pace`)


@dataclass(frozen=True)
class ShareRatio:
    """What a GPU's epoch benchmark took of the pace of runs that trained beside an unrecorded number of
    others (`share_ratio`): one ratio per such run, and the benchmark's GPU."""

    ratios: tuple[float, ...]
    device: str

    @property
    def median(self) -> float:
        return float(statistics.median(self.ratios))


@dataclass(frozen=True)
class AlonePace:
    """Seconds of a GPU's time per epoch of one run (`recent_pace` of its timed epochs' shares), and the GPU;
    `benchmark`: timed by the GPU's epoch benchmark of its configuration instead (`benchmark_paces`);
    `scaled`: a pace beside other runs times that ratio instead (`share_ratio`)."""

    seconds: float
    device: str
    benchmark: bool = False
    scaled: ShareRatio | None = None


def recent_pace(epoch_seconds: Sequence[float]) -> float:
    """Seconds per epoch to plan with: the median of the last `RECENT_EPOCHS` epochs.

    Why recent: a change to the training step moves the pace from then on (taking the host copies out
    of the step took InfoPro (Contrast) K = 16 from 26.9 to 15.1 s an epoch halfway through its run).
    Why a median: the last epochs of a call on a GPU can run alone (a third of their pace beside three
    others) and a few epochs may run on a CPU, hundreds of times slower; neither should set the plan.
    """
    return float(statistics.median(list(epoch_seconds)[-RECENT_EPOCHS:]))


def shared_seconds(intervals: list[tuple[float, float]]) -> list[float]:
    """Each (start, end) interval's share of the time it covers, every moment split evenly among the
    intervals covering it: an interval alone keeps its length; the shares of all sum to the time covered.
    An empty interval covers no time and gets none."""
    edges = sorted((time, opens, i) for i, (start, end) in enumerate(intervals) if end > start
                   for time, opens in ((start, True), (end, False)))  # at one instant, ends before starts
    shares, running, last = [0.0] * len(intervals), set(), None
    for time, opens, i in edges:
        for j in running:
            shares[j] += (time - last) / len(running)
        last = time
        (running.add if opens else running.discard)(i)
    return shares


def epoch_intervals(run: Path) -> list[tuple[float, float]]:
    """(start, end), in Unix seconds, of each training epoch of `run` that records when it ended (runs begun
    before `ended_at` existed leave it blank in their earlier epochs); evaluation falls between them."""
    table = read_metrics(run, ("epoch_seconds",))
    if "ended_at" not in table:
        return []
    table = table.dropna(subset=["ended_at", "epoch_seconds"])
    return [(end - seconds, end) for end, seconds in zip(table["ended_at"], table["epoch_seconds"])]


def gpu_of(run: Path) -> str | None:
    """The GPU a run trained on last (its latest provenance record), or None when that was no GPU or the
    run has no config.json to say."""
    if not (run / "config.json").is_file():
        return None
    record = read_json(run / "config.json", ("provenance",))
    provenance = (record.get("resumed") or [record["provenance"]])[-1]
    return provenance["device_name"] if provenance["device"] == "cuda" else None


def alone_paces(root: Path) -> dict[str, AlonePace]:
    """Per run id under `root`: its GPU time per epoch, from the epochs that recorded when they ran
    (`shared_seconds` over the epochs of every run on the same GPU model); runs last trained on a CPU,
    or with no such epoch, are left out. Leases never overlap, so epochs of the same GPU model that
    overlap in time ran on the same GPU."""
    epochs: dict[str, list] = {}  # GPU model: [(run id, start, end)]
    for run in sorted(path.parent for path in root.glob("*/metrics.csv")):
        gpu = gpu_of(run)
        if gpu is not None:
            epochs.setdefault(gpu, []).extend((run.name, start, end) for start, end in epoch_intervals(run))
    paces = {}
    for gpu, timed in epochs.items():
        shares: dict[str, list[float]] = {}
        for (run_id, _, _), share in zip(timed, shared_seconds([(start, end) for _, start, end in timed])):
            shares.setdefault(run_id, []).append(share)
        paces |= {run_id: AlonePace(recent_pace(run_shares), gpu)
                  for run_id, run_shares in shares.items()}
    return paces


def benchmark_key(arch: str, dataset: str, batch_size: int, precision: str, method: str, K: int) -> tuple:
    """What an epoch's GPU time depends on, as a configuration and an epoch benchmark's row both give it."""
    return arch, dataset, int(batch_size), precision, method, int(K)


def config_key(config: TrainConfig) -> tuple | None:
    """`benchmark_key` of a run of the whole training set (the only kind the epoch benchmark times), else None."""
    if config.train_subset is not None:
        return None
    return benchmark_key(config.arch, config.dataset, config.batch_size, config.precision, config.method, config.K)


def benchmark_paces(bench: Path) -> dict[tuple, AlonePace]:
    """Per `benchmark_key`: the seconds per epoch that a GPU's epoch benchmark (`infopro.epoch_bench`, under
    `bench`) measured in the mode training takes on that GPU (`auto_step_mode`). Each measurement trains
    alone in a fresh process, so all of that time is the epoch's share of the GPU. Where several GPU models
    timed a configuration, the slowest plans: the lease's GPU is not known in advance."""
    paces: dict[tuple, AlonePace] = {}
    for path in sorted(bench.glob(epoch_csv(bench, "*").name)):
        gpu = path.stem.removeprefix(epoch_csv(bench, "").stem)
        table = read_epoch_table(path)
        rows = table[(table["mode"] == auto_step_mode(gpu, bench)) & table["epoch_seconds"].notna()
                     & (table["device"] == "cuda")]
        for row in rows.itertuples():
            key = benchmark_key(row.arch, row.dataset, row.batch_size, row.precision, row.method, row.K)
            pace = AlonePace(float(row.epoch_seconds), row.device_name, benchmark=True)
            if key not in paces or pace.seconds > paces[key].seconds:
                paces[key] = pace
    return paces


def share_ratio(root: Path, benchmarked: dict[tuple, AlonePace], alone: dict[str, AlonePace]) -> ShareRatio | None:
    """For each run under `root` last trained on a GPU with no share of it on record (not in `alone`: its
    epochs ran before `ended_at`, beside an unrecorded number of other runs) whose configuration an epoch
    benchmark timed (`benchmarked`): the benchmark's seconds per epoch over the run's recent pace. What
    such a pace is worth in GPU time where neither a share nor a benchmark says; None without such a
    run. Where benchmarks of several GPUs enter, the GPU with the largest median plans (the slowest)."""
    ratios: dict[str, list[float]] = {}
    for run in sorted(path.parent for path in root.glob("*/metrics.csv")):
        if run.name in alone or gpu_of(run) is None:
            continue
        record = read_json(run / "config.json", ("config",))
        pace = benchmarked.get(config_key(TrainConfig.from_dict(record["config"])))
        seconds = read_metrics(run, ("epoch_seconds",))["epoch_seconds"]
        if pace is not None and len(seconds):
            ratios.setdefault(pace.device, []).append(pace.seconds / recent_pace(seconds))
    found = [ShareRatio(tuple(values), device) for device, values in sorted(ratios.items())]
    return max(found, key=lambda ratio: ratio.median, default=None)


def about_minutes(minutes: float) -> str:
    """Minutes rounded for a plan, and never "about 0 min" for a run a few epochs short of done."""
    return "under 1 min" if minutes < 0.5 else f"about {minutes:.0f} min"
