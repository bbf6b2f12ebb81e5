"""Everything this repository needs a GPU for, as stages run in order of value within a time budget.

The GPU-lease workflow behind `python -m experiments.reproduce`, kept at the edge of the
repository: the library knows nothing of leases. GPU time comes in short leases, so the work is
cut into stages, each skipped once the file it writes exists (grids resume their partial runs):
calling again continues where the last call stopped. The measurements come first (seconds per
epoch in each step mode, which decides the mode every grid trains in; the Table 3 benchmark and
the input pipeline, module-parallel throughput, the max-batch search, the profiles, the
re-timing), then the project's order of training and analysis: the remainder estimator's budget
and its estimates of the seed-0 E2E and greedy SL networks (the paper's figure), how many
trainings at once fill the GPU (the grid's --jobs, measured just before the grids), DGL's seed-0
row, the unfinished runs of Table 2, the other seed-0 networks' estimates (each network's key
layer points first: layer 1, its module ends and its last; the points between module ends after
every network's key points), the remaining seeds of Table 2 and DGL, then bf16 twins of two fp32
runs (evidence before bf16 trains any grid) and Table 3's steps timed compiled, as the grids train.
A lent machine is lost with everything on it, so a call can pack what it wrote (`pack`) for the way
back. The other analyses of finished runs (probes, the 1c2f estimates) run on a CPU as well (`make
probes mutual-info figures tables`).
"""

import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infopro.analysis import chosen_epochs
from infopro.bench import name_slug
from infopro.bench_methods import default_methods
from infopro.cli import call
from infopro.epoch_bench import EPOCH_METHODS, EPOCH_MODES, fastest_mode, method_key
from infopro.errors import InfoProError
from infopro.grid import get_grid, grid_status, run_state, status_summary
from infopro.records import REPO_ROOT, UNKNOWN, is_temporary, read_table
from infopro.remainder_steps import fastest_step, steps_csv
from infopro.splits import key_layer_points

GRID, GRID_DATASET = "table2-resnet32", "cifar10-jpeg"
DGL_GRID = "table2-dgl-resnet32"  # the baseline row of Table 2: after GRID, which takes the time left
BF16_GRID = "bf16-twins-resnet32"  # evidence for bf16 before any new grid trains in it: after every fp32 run
MAX_BATCH_METHODS = ("e2e", "checkpoint", "greedy:4", "infopro:4", "infopro:16",
                     "infopro-balanced:2", "infopro-balanced:3", "infopro-balanced:4")
STEP_TABLE = "resnet110-b1024-fp32-"  # the benchmark's Table 3 step table, before its device slug
PIPELINE = "pipeline-resnet32-b1024-fp32-"  # the input-pipeline comparison (a ResNet-32 epoch), likewise
PROFILE_METHODS = ("e2e", "checkpoint", "greedy:4", "infopro:4", "infopro-balanced:4", "infopro:16")
# Table 3's time claim in the grids' training mode: InfoPro* against E2E (compiling ResNet-110's modules takes
# minutes a method; checkpointing and offloading step eagerly only).
COMPILED_METHODS = ("e2e", "infopro-balanced:2", "infopro-balanced:3", "infopro-balanced:4", "infopro:4")
# The epoch benchmark starts no measurement after this many minutes and continues in the next call: a cold
# compile of InfoPro K = 16's modules alone took 3 min on a CPU, and a lease's minutes go to training.
EPOCH_BENCH_MINUTES = 3
# The remainder estimator (analysis.remainder) on the seed-0 networks of GRID: its budget is chosen
# against E2E, shortest candidate first; the paper's figure (E2E, greedy SL) goes before DGL's row,
# the other methods after the unfinished runs of Table 2.
REMAINDER_REFERENCE = f"{GRID_DATASET}-resnet32-e2e-K1-s0"
REMAINDER_CANDIDATES = (30, 45, 60)
REMAINDER_FIRST = ("e2e-K1", "greedy-K2", "greedy-K4", "greedy-K8", "greedy-K16")
REMAINDER_LATER = tuple(f"{method}-K{K}" for method in ("infopro-contrast", "infopro-softmax", "dgl")
                        for K in (2, 4, 8, 16))
# Seconds per epoch and unit of `point_work` on a GPU where no remainder pass was timed yet: twice the
# H200's (its ceiling: 30 epochs of 17 units in 58 s, 0.11 s), as a GPU of unknown speed may be slower
# and a pass that overruns the lease loses its points. The first pass timed there replaces it.
GUESS_SECONDS_PER_WORK = 0.23
REMAINDER_POINTS = 16  # a ResNet-32's layer points
# Measured minutes are planned with a quarter more, and a minute to start the process and load the data.
REMAINDER_MARGIN, REMAINDER_START_MINUTES = 1.25, 1.0


@dataclass(frozen=True)
class Stage:
    """One piece of GPU work: `done()` says whether its results exist; `command(minutes_left)`
    is the command line that makes them; it is started only with at least `minutes` left.
    `progress()` says how far a stage done over several calls has come (no lines: nothing to say);
    `reads()` names the committed weights it starts from, which a call must carry to the GPU.
    `minutes` may be a function, asked when the stage comes up: an earlier stage of the same call
    may have measured what it needs."""

    name: str
    description: str
    done: Callable[[], bool]
    command: Callable[[float], list[str]]
    minutes: float | Callable[[], float]
    progress: Callable[[], list[str]] = lambda: []
    reads: Callable[[], list[Path]] = lambda: []

    def minutes_needed(self) -> float:
        return self.minutes() if callable(self.minutes) else self.minutes


def gpu_files(folder: Path, pattern: str) -> list[Path]:
    """Files matching `pattern` that were measured on a GPU (every CSV name carries its device)."""
    return [path for path in sorted(folder.glob(pattern)) if "-cpu" not in path.stem]


def adds_to(bench: Path, measured: str, gpu: str | None, made: Callable[[str], bool]) -> bool:
    """Whether what a stage adds to the file `measured<slug>.csv` under `bench` exists (`made(slug)`)
    for the GPU `gpu` (a device slug; None, when planning: for any GPU that measured one).

    Why: Table 3 and the README set a profile, the idle time and a re-measurement beside the
    measurement of the same GPU, found by name. A GPU that measured no such file has nothing to
    add to, and on it the stage counts as done: its lease goes to the grid, instead of to files
    that would stand beside nothing (and make the stage look done for the GPU that needs them).
    """
    slugs = [path.stem.removeprefix(measured) for path in gpu_files(bench, f"{measured}{gpu or '*'}.csv")]
    if gpu is not None and not slugs:
        return True
    return any(made(slug) for slug in slugs)


def profiled(bench: Path, gpu: str | None = None) -> bool:
    """Whether the step table of `gpu` (`adds_to`) has its operator profile and GPU idle-time CSVs
    beside it; a profile made before the idle-time analysis existed lacks the latter: made again."""
    return adds_to(bench, STEP_TABLE, gpu, lambda slug: all(
        (bench / f"{kind}-{STEP_TABLE}{slug}.csv").is_file() for kind in ("profile", "idle")))


def retimed(bench: Path, gpu: str | None = None) -> bool:
    """Whether the step table of `gpu` (`adds_to`) has a twin under `bench`/remeasured/ (same name)
    that times every method of the default set, beside the input pipeline timed again there.

    Why: the step table and the pipeline comparison of the first lease were measured while a step
    still copied to and from the host (each copy made the host wait for the GPU's queue); the `retime`
    stage times them again with the current step, and Table 3 shows those times
    (`infopro.figures.with_remeasured_times`). A call cut short leaves methods out: it runs again.
    """
    remeasured = bench / "remeasured"
    return adds_to(bench, STEP_TABLE, gpu, lambda slug: times_every_method(remeasured / f"{STEP_TABLE}{slug}.csv")
                   and (remeasured / f"{PIPELINE}{slug}.csv").is_file())


def times_every_method(table: Path) -> bool:
    """Whether the step table `table` exists and holds every method of the default set."""
    return table.is_file() and set(default_methods("resnet110")) <= set(
        read_table(table, "delete it to time the methods again", ("method",))["method"])


def steady_jobs_tables(bench: Path, gpu: str | None = None) -> list:
    """The `grid --measure-jobs` tables of `gpu` (None: any GPU) that counted images/s only while every run
    trained at once (their `window_seconds`); an older file added up the last epochs of runs that had
    not all overlapped, which overstated what several runs at once give."""
    tables = [read_table(path, "delete it to measure again with `grid --measure-jobs`", ("jobs", "best"))
              for path in gpu_files(bench, f"grid-jobs-{GRID}-{gpu or '*'}.csv")]
    return [table for table in tables if "window_seconds" in table.columns]


def best_jobs(bench: Path, gpu: str | None) -> int:
    """The number of concurrent trainings that gave the most images/s on `gpu` (1 if unmeasured)."""
    tables = steady_jobs_tables(bench, gpu)
    if not tables:
        return 1
    return int(tables[-1].loc[tables[-1]["best"], "jobs"].iloc[0])


def epoch_tables(bench: Path, gpu: str | None = None) -> list:
    """The epoch benchmark's tables of `gpu` (None: any GPU)."""
    return [read_table(path, "delete it to measure the epochs again", ("method", "K", "mode", "precision"),
                       may_be_blank=("epoch_seconds",))  # a failed mode's row: kept, so it is never trained in
            for path in gpu_files(bench, f"epoch-resnet32-{gpu or '*'}.csv")]


def epochs_measured(bench: Path, gpu: str | None = None) -> bool:
    """Whether the epoch benchmark of `gpu` (None: any GPU) timed every method of it in every fp32 step mode."""
    wanted = {(*method_key(method), mode) for method in EPOCH_METHODS for mode in EPOCH_MODES}
    fp32 = [table[table["precision"] == "fp32"] for table in epoch_tables(bench, gpu)]
    return any(wanted <= set(zip(table["method"], table["K"], table["mode"])) for table in fp32)


def training_step_mode(bench: Path, gpu: str | None) -> str:
    """The step mode the grids train in on `gpu`: the fastest fp32 mode its epoch benchmark measured for a
    run's process, compiling included (`fastest_mode`), or `auto` (compiled on CUDA) before it has
    measured both."""
    tables = epoch_tables(bench, gpu) if gpu else []
    return (fastest_mode(tables[-1]) if tables else None) or "auto"


def ceiling_measured(ceilings: Path) -> bool:
    """Whether the remainder estimator's budget is settled: a candidate's ceiling came within 2 points of
    the reference, or every candidate was measured (then the estimates wait for a person's choice)."""
    if not ceilings.is_file():
        return False
    table = read_table(ceilings, "delete it to measure the ceilings again", ("run_id", "rem_epochs", "within_2_points"))
    mine = table[table["run_id"] == REMAINDER_REFERENCE]
    return (mine["within_2_points"].astype(str) == "True").any() or set(REMAINDER_CANDIDATES) <= set(mine["rem_epochs"])


def point_work(layer: int) -> int:
    """A layer point's share of a remainder pass: its remainder trains the blocks after it and the head, and
    InfoPro's decoder beside them, so its work is taken as the layer points after it plus one: 17 for the
    image (the ceiling, point 0), 1 at layer 16. The sixteen points then sum to 136, eight ceilings, as 2
    CPU cores measured (44.0 s against 5.5 s an epoch, docs/analysis.md)."""
    return REMAINDER_POINTS + 1 - layer


def seconds_per_work(table: Path, gpu: str, step: str = "eager") -> float | None:
    """The most seconds per epoch and unit of `point_work` that a remainder pass with `step` steps took on
    `gpu` (a device slug), from the rows in `table` (a pass: the rows of one run sharing its
    `pass_seconds`; rows from before `pass_step` was recorded ran eagerly); None: no pass timed there."""
    if not table.is_file():
        return None
    rows = read_table(table, "restore it from git", ("run_id", "layer"))
    if "pass_seconds" not in rows:
        return None
    steps = rows["pass_step"].fillna("eager") if "pass_step" in rows else "eager"
    mine = rows[rows["pass_seconds"].notna() & (rows["analysis_device"].map(name_slug) == gpu)
                & (rows["estimator"] == "remainder") & (steps == step)]
    passes = mine.groupby(["run_id", "pass_seconds", "rem_epochs"])["layer"]
    rates = [seconds / epochs / sum(map(point_work, layers)) for (_, seconds, epochs), layers in passes]
    return max(rates) if rates else None


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


def measured_seconds_per_work(bench: Path, gpu: str, step: str) -> float | None:
    """Seconds per epoch and unit of `point_work` of the step measurement's pass in `step` mode (every
    layer point of one network), or None."""
    table = steps_table(bench, gpu)
    rows = None if table is None else table[(table["step"] == step) & table["epoch_seconds"].notna()]
    if rows is None or rows.empty:
        return None
    row = rows.iloc[-1]
    return float(row["epoch_seconds"]) / sum(map(point_work, range(1, int(row["points"]) + 1)))


def remainder_minutes(mi: Path, ceilings: Path, bench: Path, gpu: str | None, points: list[int]) -> float:
    """What a remainder pass over the layer `points` needs on `gpu`, at the budget the ceiling chose: their
    `point_work` at the slowest rate timed there in the pass's step mode (`remainder_step`: the networks'
    passes first, then the step measurement's, then, for eager steps, the ceiling's; else
    GUESS_SECONDS_PER_WORK), with REMAINDER_MARGIN and a minute to start.

    Why measured: a stage is started only with the minutes it needs left, and a pass that overruns the
    lease loses its points; the guess alone would start some too late and keep others out."""
    try:
        epochs = chosen_epochs(ceilings)
    except InfoProError:  # no ceiling yet, or every candidate fell short: the stage's command says so at once
        return REMAINDER_START_MINUTES
    step = remainder_step(bench, gpu)
    rate = (gpu and (seconds_per_work(mi, gpu, step) or measured_seconds_per_work(bench, gpu, step)
                     or seconds_per_work(ceilings, gpu, step))) or GUESS_SECONDS_PER_WORK
    return REMAINDER_MARGIN * rate * epochs * sum(map(point_work, points)) / 60 + REMAINDER_START_MINUTES


def missing_points(mi: Path, run_id: str, points: list[int]) -> list[int]:
    """The layer `points` of `run_id` without a remainder row in mutual_information.csv, in order."""
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


def stages(results: Path, data_root: str | None, gpu: str | None = None) -> list[Stage]:
    """The GPU stages in the order they run; `results` is the repository's results/ folder and `gpu`
    the device slug of the GPU they will run on (None when only planning).

    The commands run in the repository root, so the paths they are given are absolute.
    """
    bench, runs = results.resolve() / "bench", results.resolve() / "runs"
    python = [sys.executable, "-m"]
    data = ["--dataset", GRID_DATASET] + (["--data-root", str(Path(data_root).resolve())] if data_root else [])

    def grid_stage(name: str, grid_name: str, seeds: tuple[int, ...] | None = None,
                   only: list[str] | None = None) -> Stage:
        """A grid of trainings on the JPEG copy (`seeds`, default every one; `only`: those run ids), as
        many at once as the GPU's measured best."""
        configs = get_grid(grid_name).configs(seeds=seeds, only=only, dataset=GRID_DATASET)
        which = ("the unfinished runs" if only else "every seed" if seeds is None
                 else f"seed {', '.join(map(str, seeds))}")
        return Stage(name, f"the {grid_name} grid on {GRID_DATASET}, {which}, resumable",
                     lambda: all(run_state(config, runs) == "done" for config in configs),
                     lambda left: python + ["experiments.grid", grid_name, *data, "--jobs", str(best_jobs(bench, gpu)),
                                            "--step", training_step_mode(bench, gpu), "--time-budget", f"{left:.1f}",
                                            "--out", str(runs)]
                     + (["--seeds", *map(str, seeds)] if seeds else []) + (["--only", *only] if only else []),
                     minutes=2,
                     progress=lambda: status_summary(grid_status(configs, runs)),
                     reads=lambda: [path for path in (runs / config.run_id() / "checkpoint.pt" for config in configs)
                                    if path.is_file() and not (path.parent / "summary.json").is_file()])

    unfinished = [config.run_id() for config in get_grid(GRID).configs(dataset=GRID_DATASET)
                  if run_state(config, runs).startswith("partial")]
    analysis = results.resolve() / "analysis"
    ceilings, mi = analysis / "remainder_ceiling.csv", analysis / "mutual_information.csv"
    remainder = python + ["analysis.remainder"]
    root = ["--data-root", str(Path(data_root).resolve())] if data_root else []

    def pass_minutes(points: list[int]) -> float:
        return remainder_minutes(mi, ceilings, bench, gpu, points)

    def remainder_stage(name: str, what: str, run_id: str, points: list[int]) -> Stage:
        """The remainder estimator on the layer `points` of `run_id`: each call estimates those of them
        that fit (`points_that_fit`), and packs after (`run_stages`'s `after`)."""
        def missing():
            return missing_points(mi, run_id, points)
        return Stage(name, f"I(h,y), I(h,x) in the paper's units at {what} of {run_id}", lambda: not missing(),
                     lambda left: remainder + ["layers", "--only", run_id, "--layers", ",".join(
                         map(str, points_that_fit(missing(), pass_minutes, left))),
                         "--runs", str(runs), "--ceilings", str(ceilings), "--out", str(mi),
                         "--step", remainder_step(bench, gpu), *root],
                     minutes=lambda: pass_minutes(missing()[:1]), progress=lambda: points_progress(missing(), points),
                     reads=lambda: [runs / run_id / "model.pt"])

    def with_weights(networks: tuple[str, ...]):
        """(network, run id, key layer points, the points between them) of each seed-0 network whose
        weights are here (`network_points`)."""
        for network in networks:
            run_id = f"{GRID_DATASET}-resnet32-{network}-s0"
            if (runs / run_id / "model.pt").is_file():
                yield network, run_id, *network_points(network)

    def remainder_stages(networks: tuple[str, ...]) -> list[Stage]:
        """One stage per network for its key layer points, which the paper's claims are read at."""
        return [remainder_stage(f"remainder:{network}", "layer 1, the module ends and layer 16" if between
                                else "every layer", run_id, key)
                for network, run_id, key, between in with_weights(networks)]

    def between_stages(networks: tuple[str, ...]) -> list[Stage]:
        """One stage per network for the layer points between its module ends (none for E2E)."""
        return [remainder_stage(f"remainder-between:{network}", "the layers between module ends", run_id, between)
                for network, run_id, _, between in with_weights(networks) if between]

    def remainder_steps_stage() -> list[Stage]:
        """The remainder passes' step mode, timed on E2E's network where its weights are here."""
        weights = runs / REMAINDER_REFERENCE / "model.pt"
        measured = (lambda: steps_table(bench, gpu) is not None) if gpu else (
            lambda: bool(gpu_files(bench, steps_csv(bench, "*").name)))
        return [Stage("remainder-steps", "seconds per epoch of a remainder pass over E2E's layer points, eager "
                                         "against CUDA-graphed steps (the passes after it take the faster that agrees)",
                      measured,
                      lambda left: remainder + ["steps", "--reference", REMAINDER_REFERENCE, "--runs", str(runs),
                                                "--out", str(bench), *root],
                      minutes=2,  # unmeasured: the data, two epochs of 10,500 images in each mode, sixteen captures
                      reads=lambda: [weights])] if weights.is_file() else []

    return [
        Stage("epoch-bench", "seconds per ResNet-32 epoch, eager and compiled steps, fp32: E2E, greedy SL K = 4, "
                             "InfoPro (Contrast) K = 4 and 16 (the grids train in the faster mode)",
              lambda: epochs_measured(bench, gpu),
              lambda left: python + ["experiments.bench_epochs", *data, "--out", str(bench),
                                     "--time-budget", f"{min(EPOCH_BENCH_MINUTES, left):.1f}"],
              minutes=EPOCH_BENCH_MINUTES),
        Stage("table3", "every method's step time and memory, ResNet-110, batch 1024, fp32; our input "
                        "pipeline against a DataLoader",
              lambda: bool(gpu_files(bench, f"{STEP_TABLE}*.csv") and gpu_files(bench, f"{PIPELINE}*.csv")),
              lambda left: python + ["experiments.bench", "--measure", "steps", "pipeline", "--out", str(bench)],
              minutes=8),
        Stage("module-parallel", "images/s of one rank per module against the synchronous trainer, K = 2, 4",
              lambda: bool(gpu_files(bench, "module-parallel-resnet32-infopro-b1024-*.csv")),
              lambda left: python + ["experiments.bench_module_parallel", "--device", "cuda", "--batch-size", "1024",
                                     "--train-subset", "50000", *data, "--out", str(bench)],
              minutes=5),
        Stage("max-batch", "largest batch under 2, 4 and 8 GiB, ResNet-110",
              lambda: bool(gpu_files(bench, "resnet110-fp32-*-maxbatch.csv")),
              lambda left: python + ["experiments.bench", "--measure", "max-batch", "--caps", "2,4,8",
                                     "--methods", *MAX_BATCH_METHODS, "--out", str(bench)],
              minutes=10),
        Stage("profile", "the operators a step's time goes to and where the GPU's idle time goes, ResNet-110, "
                         "batch 1024: E2E, checkpointing, greedy SL, InfoPro and InfoPro* at K = 4, InfoPro at K = 16",
              lambda: profiled(bench, gpu),
              lambda left: python + ["experiments.bench", "--measure", "profile", "--steps", "5",
                                     "--methods", *PROFILE_METHODS, "--out", str(bench)],
              minutes=3),
        Stage("profile-resnet32", "where a ResNet-32 E2E step's time goes, batch 1024 (the goal of an epoch in "
                                  "0.5 s): its operators and the GPU's idle time",
              lambda: adds_to(bench, PIPELINE, gpu,
                              lambda slug: (bench / f"idle-resnet32-b1024-fp32-{slug}.csv").is_file()),
              lambda left: python + ["experiments.bench", "--arch", "resnet32", "--measure", "profile", "--steps", "5",
                                     "--methods", "e2e", "--out", str(bench)],
              minutes=1),
        Stage("retime", "every method's step time again with the current training step, ResNet-110, batch "
                        "1024, fp32, and our input pipeline against a DataLoader (both first timed with host "
                        "copies in a step)",
              lambda: retimed(bench, gpu),
              lambda left: python + ["experiments.bench", "--measure", "steps", "pipeline",
                                     "--out", str(bench / "remeasured")],
              minutes=6),  # as table3, which took 5.7 min on an H100
        Stage("remainder-ceiling", "the remainder estimator's budget: a ResNet-32 trained from the image with "
                                   f"{', '.join(map(str, REMAINDER_CANDIDATES))} epochs until one comes within 2 "
                                   "points of E2E's test accuracy",
              lambda: ceiling_measured(ceilings),
              lambda left: remainder + ["ceiling", "--reference", REMAINDER_REFERENCE, "--candidates",
                                        *map(str, REMAINDER_CANDIDATES), "--runs", str(runs),
                                        "--ceilings", str(ceilings), *root],
              minutes=3),  # unmeasured: at most 135 epochs of one ResNet-32, about 1 s each on an H100
        *remainder_steps_stage(),
        *remainder_stages(REMAINDER_FIRST),
        Stage("grid-jobs", f"how many trainings at once fill the GPU ({GRID}), counted while all of them train",
              lambda: bool(steady_jobs_tables(bench, gpu)),
              lambda left: python + ["experiments.grid", GRID, *data, "--measure-jobs", "1", "2", "4",
                                     "--step", training_step_mode(bench, gpu), "--bench-out", str(bench)],
              minutes=3),
        grid_stage("dgl-seed0", DGL_GRID, seeds=(0,)),
        *([grid_stage("table2-unfinished", GRID, only=unfinished)] if unfinished else []),
        *remainder_stages(REMAINDER_LATER),
        *between_stages(REMAINDER_FIRST + REMAINDER_LATER),
        grid_stage("table2", GRID),
        grid_stage("dgl", DGL_GRID),
        grid_stage("bf16-twins", BF16_GRID),
        Stage("table3-compiled", "step times with each local module compiled (the grids' training mode), ResNet-110, "
                                 f"batch 1024, fp32, beside the eager step table: {', '.join(COMPILED_METHODS)}",
              lambda: adds_to(bench, STEP_TABLE, gpu, lambda slug: (bench / "compiled" / f"{STEP_TABLE}{slug}.csv")
                              .is_file()),
              lambda left: python + ["experiments.bench", "--measure", "steps", "--step", "compiled",
                                     "--methods", *COMPILED_METHODS, "--out", str(bench)],
              minutes=10),  # unmeasured: mostly compiling, a ResNet-32's modules took 1 to 3 min on a CPU
    ]


def check_code_is_named(state: dict) -> None:
    """Refuse GPU work whose results could not name the commit they came from: they are made to be
    committed, and a lease spent on records without provenance is lost. `state` is `git_state()`."""
    if UNKNOWN in (state["git_commit"], state["git_dirty"]):
        raise InfoProError("this tree has no git history: set INFOPRO_GIT_COMMIT to its commit (`git rev-parse HEAD` "
                           "where the history is) and INFOPRO_GIT_DIRTY=0, so that the results name their code")
    if state["git_dirty"]:
        raise InfoProError(f"the source differs from commit {state['git_commit'][:12]}: commit it first, so that "
                           "the results name their code")


def run_stages(plan: list[Stage], minutes: float, log=print, after=lambda: None) -> list[str]:
    """Run each unfinished stage in order while time is left; returns the names of those that failed.

    A stage that fails is reported and the next one starts: one broken measurement must not
    cost the rest of a lease. `after()` runs once each stage that ran has ended (a call packs its
    results there, so that a call killed in a later stage still brings back the earlier ones).
    """
    deadline = time.monotonic() + 60 * minutes
    failed = []
    for stage in plan:
        left = (deadline - time.monotonic()) / 60
        if stage.done():
            log(f"[{stage.name}] done already")
        elif left < (needed := stage.minutes_needed()):
            log(f"[{stage.name}] skipped: {left:.1f} min left, it needs about {needed:.3g}")
        else:
            log(f"[{stage.name}] {stage.description} ({left:.1f} min left)")
            began = time.monotonic()
            ok = call(stage.command(left), cwd=REPO_ROOT) == 0
            log(f"[{stage.name}] {'finished' if ok else 'failed; going on'} after "
                f"{(time.monotonic() - began) / 60:.1f} min")
            if not ok:
                failed.append(stage.name)
            after()
    return failed


TAR_BLOCK, TAR_RECORD = 512, 20 * 512


def results_since(results: Path, since: float) -> list[Path]:
    """The files under `results` written at or after `since` (seconds since the epoch), in path
    order: what one call made, the checkpoints of its unfinished runs included, and not the
    half-written temporaries of a training killed mid-write."""
    return [path for path in sorted(results.rglob("*"))
            if path.is_file() and not is_temporary(path) and path.stat().st_mtime >= since]


def tar_bytes(sizes: list[int]) -> int:
    """The size of an uncompressed tar holding files of `sizes`: a header block per member, its data
    padded to whole blocks, two closing blocks, the whole padded to a record."""
    blocks = sum(1 + -(-size // TAR_BLOCK) for size in sizes) + 2
    return -(-blocks * TAR_BLOCK // TAR_RECORD) * TAR_RECORD


def pack(files: list[Path], root: Path, out: Path, max_bytes: int) -> list[Path]:
    """Write `files` into tar parts `out/results-1.tar`, `-2`, ... of at most `max_bytes` each,
    named relative to `root` so that `tar xf PART` in the repository puts them back.

    Why: a lent GPU machine can be taken back between two calls, and only files under a size limit
    come back from a call. A call that packs its own results loses nothing when the machine is gone
    before the next one, and checkpoints of partial runs travel in parts small enough to come back.
    A file larger than `max_bytes` goes alone into its own part, which is then the only one over it.
    Parts of an earlier packing in `out` are removed first: packed again after every stage, a
    call's files may fill fewer parts than before (a checkpoint rewritten smaller), and a part
    left over would put older copies back.
    """
    for stale in out.glob("results-*.tar"):
        stale.unlink()
    groups: list[list[Path]] = []
    for path in files:
        if groups and tar_bytes([p.stat().st_size for p in groups[-1] + [path]]) <= max_bytes:
            groups[-1].append(path)
        else:
            groups.append([path])
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for number, group in enumerate(groups, start=1):
        part = out / f"results-{number}.tar"
        with tarfile.open(part, "w", format=tarfile.USTAR_FORMAT) as tar:
            for path in group:
                tar.add(path, arcname=str(path.relative_to(root)))
        parts.append(part)
    return parts
