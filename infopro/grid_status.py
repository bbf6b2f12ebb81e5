"""Where a grid's runs stand: done, partial or missing, the training each needs at its recent pace, and
the GPU time that leaves (`infopro.paces`), for `make status` and the GPU plan."""

import math
from dataclasses import dataclass, replace
from pathlib import Path

from infopro.config import TrainConfig
from infopro.paces import (AlonePace, ShareRatio, about_minutes, alone_paces, benchmark_paces, config_key, gpu_of,
                           recent_pace, share_ratio)
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
    `infopro.paces.alone_paces`, no epoch benchmark timed it and no pace on a GPU can be scaled;
    `gpu_benchmark`: the benchmark timed it; `gpu_scaled`: the ratio that scaled its pace)."""

    state: str
    detail: str = ""
    minutes_left: float | None = None
    gpu_minutes: float | None = None
    gpu: str = ""
    gpu_benchmark: bool = False
    gpu_scaled: ShareRatio | None = None


@dataclass(frozen=True)
class WallPace:
    """The seconds per epoch an unfinished run is planned at, as measured on whatever machine and beside
    however many runs, and the run directory whose recent epochs they are."""

    seconds: float
    run: Path


def grid_status(configs: list[TrainConfig], root: Path, bench: Path | None = None) -> list[RunStatus]:
    """`run_status` of each of `configs`, the GPU shares read once from every run under `root` and from
    the epoch benchmarks under `bench`, and their ratio to the paces beside others (`share_ratio`)."""
    alone = alone_paces(root) if root.is_dir() else {}
    benchmarked = benchmark_paces(bench) if bench is not None and bench.is_dir() else {}
    ratio = share_ratio(root, benchmarked, alone) if benchmarked and root.is_dir() else None
    return [run_status(config, root, alone, benchmarked, ratio) for config in configs]


def run_status(config: TrainConfig, root: Path, alone: dict[str, AlonePace] | None = None,
               benchmarked: dict[tuple, AlonePace] | None = None, ratio: ShareRatio | None = None) -> RunStatus:
    """A finished run's final test error; an unfinished run's minutes left at its recent pace, or at
    another seed's before it has run an epoch (`wall_pace`), and the GPU minutes it needs (`gpu_pace`)."""
    state, run = run_state(config, root), root / config.run_id()
    if state == "done":
        error = read_json(run / "summary.json", ("final_test_error",))["final_test_error"]
        return RunStatus(state, f"{error:.2f}% test error")
    epochs_left = config.epochs - (0 if state == "missing" else len(read_metrics(run, ("epoch_seconds",))))
    wall = wall_pace(config, root)
    status = RunStatus(state)
    if wall is not None:
        minutes = epochs_left * wall.seconds / 60
        whose = "its" if wall.run == run else f"seed {wall.run.name.rsplit('-s', 1)[1]}'s"
        left = " left" if state != "missing" else ""
        status = RunStatus(state, f"{about_minutes(minutes)}{left} at {whose} recent pace ({wall.seconds:.1f} s an "
                           "epoch)", minutes)
    pace = gpu_pace(config, alone or {}, benchmarked or {}, ratio, wall)
    return status if pace is None else replace(status, gpu_minutes=epochs_left * pace.seconds / 60, gpu=pace.device,
                                               gpu_benchmark=pace.benchmark, gpu_scaled=pace.scaled)


def other_seeds(config: TrainConfig, run_ids) -> list[str]:
    """The ids among `run_ids` of `config`'s configuration at other seeds, sorted."""
    stem = config.run_id().rsplit("-s", 1)[0]
    return sorted(name for name in run_ids if name.rsplit("-s", 1)[0] == stem and name != config.run_id())


def wall_pace(config: TrainConfig, root: Path) -> WallPace | None:
    """The run's `recent_pace` once it has run an epoch, else that of the seed of its configuration that
    ran the most epochs; None where no seed has."""
    stem = config.run_id().rsplit("-s", 1)[0]
    runs = [root / config.run_id()] + [root / name for name in other_seeds(
        config, (run.name for run in root.glob(f"{stem}-s*")))]
    paces = {run: read_metrics(run, ("epoch_seconds",))["epoch_seconds"] for run in runs
             if (run / "metrics.csv").exists()}
    paces = {run: seconds for run, seconds in paces.items() if len(seconds)}
    if not paces:
        return None
    run = runs[0] if runs[0] in paces else max(paces, key=lambda r: len(paces[r]))
    return WallPace(recent_pace(paces[run]), run)


def gpu_pace(config: TrainConfig, alone: dict[str, AlonePace], benchmarked: dict[tuple, AlonePace],
             ratio: ShareRatio | None, wall: WallPace | None) -> AlonePace | None:
    """The GPU time per epoch of the run: its own share of its GPU (`alone`), else another seed's, else the
    epoch benchmark of its configuration, which trained alone (`benchmarked`), else its pace beside others
    on a GPU times the benchmark's ratio to such paces (`share_ratio`); None where none of them exists."""
    shared = next((alone[name] for name in (config.run_id(), *other_seeds(config, alone)) if name in alone), None)
    if shared is not None or config_key(config) in benchmarked:
        return shared or benchmarked[config_key(config)]
    if ratio is None or wall is None or gpu_of(wall.run) is None:
        return None
    return AlonePace(wall.seconds * ratio.median, ratio.device, scaled=ratio)


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
    (`infopro.paces`), not from paces measured beside an unrecorded number of other runs unless scaled by
    a measured ratio (said so, with the ratio); and, with `lease_minutes`, the leases it takes at least
    (were every minute of a lease training)."""
    timed = [status for status in unfinished if status.gpu_minutes is not None]
    untimed = len(unfinished) - len(timed)
    parts = []
    if timed:
        minutes = sum(status.gpu_minutes for status in timed)
        gpus = ", ".join(sorted({status.gpu for status in timed}))
        parts.append(f"{about_minutes(minutes)} of GPU time ({gpus}) in {run_count(len(timed))}, each at the share "
                     "of the GPU its configuration's recent epochs took" + gpu_sources(timed))
        if lease_minutes:
            leases = math.ceil(minutes / lease_minutes)
            parts.append(f"at least {leases} lease{'s' * (leases != 1)} of {lease_minutes:g} device-minutes")
    if untimed:
        parts.append(f"{run_count(untimed)} without a GPU share on record (no epoch of their configuration on a GPU "
                     "recorded when it ran, no epoch benchmark of it and no pace of it on a GPU to scale)")
    return "; ".join(parts)


def gpu_sources(timed: list[RunStatus]) -> str:
    """How many of the `timed` runs took the epoch benchmark's time, and how many a scaled pace, with the
    ratio: ' (...)', or '' where every one took its configuration's own share."""
    benchmarked = sum(status.gpu_benchmark for status in timed)
    scaled = [status.gpu_scaled for status in timed if status.gpu_scaled is not None]
    parts = [f"{benchmarked} of them at the GPU's epoch benchmark of the configuration, alone"] if benchmarked else []
    for ratio in dict.fromkeys(scaled):
        parts.append(f"{scaled.count(ratio)} at their pace beside other runs times {ratio.median:.2f}, the median "
                     f"ratio of the benchmark to such a pace over {run_count(len(ratio.ratios))} "
                     f"({min(ratio.ratios):.2f} to {max(ratio.ratios):.2f})")
    return f" ({'; '.join(parts)})" if parts else ""


def run_count(n: int) -> str:
    """'1 run', '2 runs'."""
    return f"{n} run{'s' if n != 1 else ''}"
