"""Seconds per epoch to plan GPU time with: a run's recent pace, and its share of a GPU it shared.

A grid trains several runs at once on one GPU, and they take turns on it: four runs sharing an
H100 took 4.0 to 4.6 s per E2E epoch each, against 1.02 s alone (results/NOTES.md). A run's
seconds per epoch are then no measure of the GPU time it needs; the GPU time of each moment, split
evenly among the epochs running at that moment, is. So an epoch's share is its training interval
(metrics.csv's `ended_at` and `epoch_seconds`), each moment of it divided by the number of epochs of
runs on the same GPU model running then. Epochs from before `ended_at` was recorded have no interval
and no share: their runs keep only wall-clock paces, beside an unrecorded number of other runs.
"""

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infopro.records import read_json
from infopro.runs import read_metrics

RECENT_EPOCHS = 10  # the epochs whose median sets a run's pace (`recent_pace`)


@dataclass(frozen=True)
class AlonePace:
    """Seconds of a GPU's time per epoch of one run (`recent_pace` of its timed epochs' shares), and the GPU."""

    seconds: float
    device: str


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
    """The GPU a run trained on last (its latest provenance record), or None when that was no GPU."""
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
        gpu = gpu_of(run) if (run / "config.json").is_file() else None
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
