"""Where a grid's runs stand: done, partial or missing, the training each needs at its recent pace, and
the GPU time that leaves (`infopro.paces`), for `make status` and the GPU plan."""

import math
from dataclasses import dataclass, replace
from pathlib import Path

from infopro.config import TrainConfig
from infopro.paces import AlonePace, about_minutes, alone_paces, benchmark_paces, config_key, recent_pace
from infopro.records import read_json
from infopro.runs import read_metrics

def run_state(config: TrainConfig, root: Path) -> str:
    """'done', 'partial (e/E epochs)' or 'missing', from the files in the run's directory."""
    run = root / config.run_id()
    if (run / "summary.json").exists():
        return "done"
    if (run / "metrics.csv").exists():
        epochs = max(0, len((run / "metrics.csv").read_text().strip().splitlines()) - 1)
        return f"partial ({epochs}/{config.epochs} epochs)"
    return "missing"


@dataclass(frozen=True)
class RunStatus:
    """What planning GPU time needs of one run: its state (`run_state`), a finished run's test
    error or an unfinished run's time left as text, that time in minutes (None: not known), and the
    minutes of `gpu`'s time it needs (None: no epoch of its configuration records its share of a GPU,
    `infopro.paces.alone_paces`, and no epoch benchmark timed it; `gpu_benchmark`: the benchmark did)."""

    state: str
    detail: str = ""
    minutes_left: float | None = None
    gpu_minutes: float | None = None
    gpu: str = ""
    gpu_benchmark: bool = False


def grid_status(configs: list[TrainConfig], root: Path, bench: Path | None = None) -> list[RunStatus]:
    """`run_status` of each of `configs`, the GPU shares read once from every run under `root` and from
    the epoch benchmarks under `bench`."""
    alone = alone_paces(root) if root.is_dir() else {}
    benchmarked = benchmark_paces(bench) if bench is not None and bench.is_dir() else {}
    return [run_status(config, root, alone, benchmarked) for config in configs]


def run_status(config: TrainConfig, root: Path, alone: dict[str, AlonePace] | None = None,
               benchmarked: dict[tuple, AlonePace] | None = None) -> RunStatus:
    """A finished run's final test error; an unfinished run's minutes left at its recent pace
    (`recent_pace`); a missing run's at the recent pace of the same configuration at another seed.
    Every such pace is as measured, on whatever machine and with however many runs beside it; the GPU
    minutes come from `alone` (`grid_status`): the run's own share of its GPU, else another seed's, else
    from `benchmarked`: the epoch benchmark of its configuration, which trained alone."""
    state, run, alone = run_state(config, root), root / config.run_id(), alone or {}
    if state == "done":
        error = read_json(run / "summary.json", ("final_test_error",))["final_test_error"]
        return RunStatus(state, f"{error:.2f}% test error")
    metrics = read_metrics(run, ("epoch_seconds",)) if state != "missing" else None
    epochs_left = config.epochs - (0 if metrics is None else len(metrics))
    pace = next((alone[name] for name in (config.run_id(), *other_seeds(config, alone)) if name in alone),
                (benchmarked or {}).get(config_key(config)))
    gpu = {} if pace is None else dict(gpu_minutes=epochs_left * pace.seconds / 60, gpu=pace.device,
                                       gpu_benchmark=pace.benchmark)
    if metrics is None:
        return replace(missing_run_status(config, root), **gpu)
    if metrics.empty:
        return RunStatus(state, **gpu)
    seconds = recent_pace(metrics["epoch_seconds"])
    minutes = epochs_left * seconds / 60
    return RunStatus(state, f"{about_minutes(minutes)} left at its recent pace ({seconds:.1f} s an epoch)", minutes,
                     **gpu)


def other_seeds(config: TrainConfig, run_ids) -> list[str]:
    """The ids among `run_ids` of `config`'s configuration at other seeds, sorted."""
    stem = config.run_id().rsplit("-s", 1)[0]
    return sorted(name for name in run_ids if name.rsplit("-s", 1)[0] == stem and name != config.run_id())


def missing_run_status(config: TrainConfig, root: Path) -> RunStatus:
    """A run not yet started, timed by the recent pace of the other seed of its configuration that
    ran the most epochs."""
    stem = config.run_id().rsplit("-s", 1)[0]
    others = [root / name for name in other_seeds(config, (run.name for run in root.glob(f"{stem}-s*")))
              if (root / name / "metrics.csv").exists()]
    paces = {run.name: read_metrics(run, ("epoch_seconds",))["epoch_seconds"] for run in others}
    paces = {name: seconds for name, seconds in paces.items() if len(seconds)}
    if not paces:
        return RunStatus("missing")
    name = max(paces, key=lambda n: len(paces[n]))
    seconds, seed = recent_pace(paces[name]), name.rsplit("-s", 1)[1]
    minutes = config.epochs * seconds / 60
    return RunStatus("missing", f"{about_minutes(minutes)} at seed {seed}'s recent pace ({seconds:.1f} s an epoch)",
                     minutes)


def status_summary(statuses: list[RunStatus], lease_minutes: float | None = None) -> list[str]:
    """Lines on a grid's runs: how many are done, partial and missing, the training left, and the GPU
    time it needs (with `lease_minutes`, the leases of that many device-minutes it needs at least)."""
    states = [status.state.split(" ")[0] for status in statuses]
    counts = ", ".join(f"{states.count(state)} {state}" for state in ("done", "partial", "missing"))
    unfinished = [status for status in statuses if status.state != "done"]
    return [counts, time_left_line(unfinished)] + ([gpu_time_line(unfinished, lease_minutes)] if unfinished else [])


def time_left_line(unfinished: list[RunStatus]) -> str:
    """The sum of the unfinished runs' minutes left, and how many runs it cannot count."""
    known = [status.minutes_left for status in unfinished if status.minutes_left is not None]
    unknown = len(unfinished) - len(known)
    parts = []
    if known:
        parts.append(f"{about_minutes(sum(known))} of training left in {run_count(len(known))}, each at the pace given")
    if unknown:
        parts.append(f"{run_count(unknown)} not timed (no seed of theirs has run an epoch)")
    return "; ".join(parts) or "nothing left to train"


def gpu_time_line(unfinished: list[RunStatus], lease_minutes: float | None = None) -> str:
    """The GPU time the unfinished runs need, counted from each epoch's share of its GPU
    (`infopro.paces`), not from paces measured beside an unrecorded number of other runs; and, with
    `lease_minutes`, the leases it takes at least (were every minute of a lease training)."""
    timed = [status for status in unfinished if status.gpu_minutes is not None]
    untimed, benchmarked = len(unfinished) - len(timed), sum(status.gpu_benchmark for status in timed)
    parts = []
    if timed:
        minutes = sum(status.gpu_minutes for status in timed)
        gpus = ", ".join(sorted({status.gpu for status in timed}))
        parts.append(f"{about_minutes(minutes)} of GPU time ({gpus}) in {run_count(len(timed))}, each at the share "
                     "of the GPU its configuration's recent epochs took" + (
                         f" ({benchmarked} of them at the GPU's epoch benchmark of the configuration, alone)"
                         if benchmarked else ""))
        if lease_minutes:
            leases = math.ceil(minutes / lease_minutes)
            parts.append(f"at least {leases} lease{'s' * (leases != 1)} of {lease_minutes:g} device-minutes")
    if untimed:
        parts.append(f"{run_count(untimed)} without a GPU share on record (no epoch of their configuration on a GPU "
                     "recorded when it ran, and no epoch benchmark of it)")
    return "; ".join(parts)


def run_count(n: int) -> str:
    """'1 run', '2 runs'."""
    return f"{n} run{'s' if n != 1 else ''}"
