"""Sizing the remainder estimator's passes to a GPU call: each layer point's work, the pace timed on that GPU,
the points of a network still missing and the longest start of them that fits the minutes left.

The estimator (`analysis.remainder`) trains one remainder per layer point in one pass over the data; a
pass that overruns a lease loses its points, so `experiments.stages` starts a network's stage only with
the minutes its next points need, and gives it only the points that fit.
"""

from collections.abc import Callable
from pathlib import Path

import numpy as np

from infopro.analysis import ceilings_beside, chosen_epochs, read_ceilings
from infopro.errors import InfoProError
from infopro.records import name_slug, read_table
from infopro.remainder_steps import fastest_step, steps_csv
from infopro.splits import key_layer_points

# Seconds per epoch and unit of `point_work` on a GPU where no remainder pass was timed yet: twice the
# H200's (its ceiling: 30 epochs of 17 units in 58 s, 0.11 s), as a GPU of unknown speed may be slower
# and a pass that overruns the lease loses its points. The first pass timed there replaces it.
GUESS_SECONDS_PER_WORK = 0.23
REMAINDER_POINTS = 16  # a ResNet-32's layer points
# Measured minutes are planned with a quarter more, and half a minute to start the process and load the data
# and the network: on the H200 a stage took under 10 s beyond its pass (the minutes in
# lease-2026-12-04-0720.log against each row's `pass_seconds`); a fresh machine's first process also
# decodes the JPEG archive.
REMAINDER_MARGIN, REMAINDER_START_MINUTES = 1.25, 0.5


def point_work(layer: int) -> int:
    """A layer point's share of a remainder pass: its remainder trains the blocks after it and the head, and
    InfoPro's decoder beside them, so its work is taken as the layer points after it plus one: 17 for the
    image (the ceiling, point 0), 1 at layer 16. The sixteen points then sum to 136, eight ceilings, as 2
    CPU cores measured (44.0 s against 5.5 s an epoch, docs/analysis.md)."""
    return REMAINDER_POINTS + 1 - layer


def pass_pace(table: Path, gpu: str, step: str = "eager") -> tuple[float, float] | None:
    """(fixed, per_unit): a remainder pass with `step` steps on `gpu` (a device slug) is planned at fixed +
    per_unit × its points' `point_work` seconds an epoch, from the passes timed there in `table` (a pass:
    the rows of one run sharing its `pass_seconds`; rows from before `pass_step` was recorded ran eagerly).
    fixed: the least-squares intercept over those passes (0 with fewer than two sizes of pass, or where
    the fit falls below 0); per_unit: the most any pass took beyond it, so that none lies above the line.
    None: no pass timed there.

    Why an intercept: each epoch of a pass costs something whatever its points (the data's pass, the
    evaluation), which a rate per unit alone charges to every unit of a long pass. On the H200 a 21-unit
    pass took 0.071 s an epoch per unit and a 115-unit one 0.046, so the slowest rate alone planned a
    network's sixteen points at 1.5 times the fitted pace, and kept them out of calls they fit."""
    if not table.is_file():
        return None
    rows = read_table(table, "restore it from git", ("run_id", "layer"))
    if "pass_seconds" not in rows:
        return None
    steps = rows["pass_step"].fillna("eager") if "pass_step" in rows else "eager"
    mine = rows[rows["pass_seconds"].notna() & (rows["analysis_device"].map(name_slug) == gpu)
                & (rows["estimator"] == "remainder") & (steps == step)]
    passes = mine.groupby(["run_id", "pass_seconds", "rem_epochs"])["layer"]
    timed = [(sum(map(point_work, layers)), seconds / epochs) for (_, seconds, epochs), layers in passes]
    if not timed:
        return None
    works, seconds = zip(*timed)
    fixed = max(float(np.polyfit(works, seconds, 1)[1]), 0.0) if len(set(works)) > 1 else 0.0
    return fixed, max((epoch - fixed) / work for work, epoch in timed)


def steps_table(bench: Path, gpu: str | None):
    """The remainder step measurement of `gpu` (`analysis.remainder steps`), or None."""
    path = steps_csv(bench, gpu)
    return read_table(path, "delete it to measure the remainder steps again", ("step", "points", "agrees_with_eager"),
                      may_be_blank=("epoch_seconds",)) if gpu and path.is_file() else None


def remainder_step(bench: Path, gpu: str | None) -> str:
    """The step mode of the remainder passes on `gpu`: the fastest that agrees with eager steps, as measured
    there (`infopro.remainder_steps.fastest_step`); eager before that."""
    table = steps_table(bench, gpu)
    return (fastest_step(table) if table is not None else None) or "eager"


def measured_pace(bench: Path, gpu: str, step: str) -> tuple[float, float] | None:
    """The step measurement's pass in `step` mode (every layer point of one network) as a `pass_pace`: no
    fixed part (one size of pass), its seconds an epoch per unit of `point_work`; or None."""
    table = steps_table(bench, gpu)
    rows = None if table is None else table[(table["step"] == step) & table["epoch_seconds"].notna()]
    if rows is None or rows.empty:
        return None
    row = rows.iloc[-1]
    return 0.0, float(row["epoch_seconds"]) / sum(map(point_work, range(1, int(row["points"]) + 1)))


def remainder_minutes(mi: Path, ceilings: Path, bench: Path, gpu: str | None, points: list[int],
                      reference: str, times: int = 1) -> float:
    """What a remainder pass over the layer `points` needs on `gpu`, at `times` the budget that the ceiling
    against the run `reference` chose: their `point_work` at the pace timed there in the pass's step mode
    (`remainder_step`: the networks' passes' `pass_pace` first, then the step measurement's rate, then,
    for eager steps, the ceiling's; else GUESS_SECONDS_PER_WORK), with REMAINDER_MARGIN and
    REMAINDER_START_MINUTES.

    Why measured: a stage is started only with the minutes it needs left, and a pass that overruns the
    lease loses its points; the guess alone would start some too late and keep others out."""
    try:
        epochs = chosen_epochs(ceilings, network={"run_id": reference})
    except InfoProError:  # no ceiling yet, or every candidate fell short: the stage's command says so at once
        return REMAINDER_START_MINUTES
    step = remainder_step(bench, gpu)
    fixed, per_unit = (gpu and (pass_pace(mi, gpu, step) or measured_pace(bench, gpu, step)
                                or pass_pace(ceilings, gpu, step))) or (0.0, GUESS_SECONDS_PER_WORK)
    seconds = times * epochs * (fixed + per_unit * sum(map(point_work, points)))
    return REMAINDER_MARGIN * seconds / 60 + REMAINDER_START_MINUTES


def ceiling_measured(ceilings: Path, reference: str, candidates: tuple[int, ...]) -> bool:
    """Whether the remainder estimator's budget is settled against the run `reference`: a candidate's ceiling
    came within 2 points of it, or every one of `candidates` (epochs) was measured (then the estimates wait
    for a person's choice)."""
    if not ceilings.is_file():
        return False
    table = read_table(ceilings, "delete it to measure the ceilings again", ("run_id", "rem_epochs", "within_2_points"))
    mine = table[table["run_id"] == reference]
    return (mine["within_2_points"].astype(str) == "True").any() or set(candidates) <= set(mine["rem_epochs"])


def longer_ceiling_measured(ceilings: Path, reference: str, times: int) -> bool:
    """Whether `ceilings` holds a ceiling at `times` the budget that the ceiling against the run `reference`
    chose, measured against any network of its recipe (`ceilings_beside`), as `analysis.remainder budget`
    then trains none."""
    try:
        epochs = chosen_epochs(ceilings, network={"run_id": reference})
    except InfoProError:  # no budget chosen yet
        return False
    table = read_ceilings(ceilings)
    chose = table[(table["run_id"] == reference) & (table["rem_epochs"] == epochs)].iloc[-1]
    return not ceilings_beside(table, chose.to_dict() | {"rem_epochs": times * epochs}).empty


def missing_points(mi: Path, run_id: str, points: list[int]) -> list[int]:
    """The layer `points` of `run_id` without a remainder row in `mi` (mutual_information.csv, or the budget
    check's remainder_budget.csv), in order."""
    table = read_table(mi, "restore it from git", ("run_id", "layer", "estimator")) if mi.is_file() else None
    done = set() if table is None else set(table.loc[(table["run_id"] == run_id)
                                                     & (table["estimator"] == "remainder"), "layer"])
    return [layer for layer in points if layer not in done]


def points_progress(missing: list[int], points: list[int]) -> list[str]:
    """A line for a network whose remainder `points` are partly estimated (none otherwise)."""
    done = len(points) - len(missing)
    return [f"{done} of {len(points)} layer points estimated"] if 0 < done < len(points) else []


def network_points(network: str) -> tuple[list[int], list[int]]:
    """A seed-0 ResNet-32 network's (key layer points, the points between them), e.g. for "greedy-K4":
    ([1, 4, 8, 12, 16], [2, 3, 5, ...]); E2E's key points are all of them (`splits.key_layer_points`)."""
    key = key_layer_points("resnet32", int(network.rsplit("-K", 1)[1]))
    return key, [layer for layer in range(1, REMAINDER_POINTS + 1) if layer not in key]


def points_that_fit(points: list[int], minutes: Callable[[list[int]], float], left: float) -> list[int]:
    """The longest start of `points` whose pass needs no more than `left` minutes (at least the first).

    Why: a network's sixteen points take about eight ResNet-32 trainings, more than a lease has after
    its other stages (7.7 min at 30 epochs on an H200); the earliest, dearest points go first, and a
    later call continues with the rest, resumed point by point from the rows already written."""
    fitting = [points[:n] for n in range(1, len(points) + 1) if minutes(points[:n]) <= left]
    return fitting[-1] if fitting else points[:1]
