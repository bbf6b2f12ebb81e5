"""Which GPU measurements under results/bench/ exist, and what they decide for the GPU work of
`experiments.stages`: whether a benchmark stage is done, how many trainings run at once, and the step
mode the grids train in. Every file's name ends in the device slug of the machine that measured it.
"""

from collections.abc import Callable
from pathlib import Path

from infopro.bench_methods import default_methods
from infopro.epoch_bench import EPOCH_METHODS, EPOCH_MODES, method_key
from infopro.records import read_table
from infopro.step import auto_step_mode, epoch_csv, read_epoch_table

STEP_TABLE = "resnet110-b1024-fp32-"  # the benchmark's Table 3 step table, before its device slug
PIPELINE = "pipeline-resnet32-b1024-fp32-"  # the input-pipeline comparison (a ResNet-32 epoch), likewise


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


def steady_jobs_tables(bench: Path, grid: str, gpu: str | None = None) -> list:
    """The `grid <grid> --measure-jobs` tables of `gpu` (None: any GPU) that counted images/s only while every run
    trained at once (their `window_seconds`); an older file added up the last epochs of runs that had
    not all overlapped, which overstated what several runs at once give."""
    tables = [read_table(path, "delete it to measure again with `grid --measure-jobs`", ("jobs", "best"))
              for path in gpu_files(bench, f"grid-jobs-{grid}-{gpu or '*'}.csv")]
    return [table for table in tables if "window_seconds" in table.columns]


def best_jobs(bench: Path, grid: str, gpu: str | None) -> int:
    """The number of concurrent trainings of `grid` that gave the most images/s on `gpu` (1 if unmeasured)."""
    tables = steady_jobs_tables(bench, grid, gpu)
    if not tables:
        return 1
    return int(tables[-1].loc[tables[-1]["best"], "jobs"].iloc[0])


def epoch_tables(bench: Path, gpu: str | None = None) -> list:
    """The epoch benchmark's tables of `gpu` (None: any GPU)."""
    return [read_epoch_table(path) for path in gpu_files(bench, epoch_csv(bench, gpu or "*").name)]


def epochs_measured(bench: Path, gpu: str | None = None) -> bool:
    """Whether the epoch benchmark of `gpu` (None: any GPU) timed every method of it in every fp32 step mode."""
    wanted = {(*method_key(method), mode) for method in EPOCH_METHODS for mode in EPOCH_MODES}
    fp32 = [table[table["precision"] == "fp32"] for table in epoch_tables(bench, gpu)]
    return any(wanted <= set(zip(table["method"], table["K"], table["mode"])) for table in fp32)


def training_step_mode(bench: Path, gpu: str | None) -> str:
    """The step mode the grids train in on `gpu`, named in their command: the fastest fp32 mode its epoch
    benchmark under `bench` measured for a run's process, compiling included, else eager
    (`infopro.step.auto_step_mode`); `auto` when only planning, the GPU unknown."""
    return auto_step_mode(gpu, bench) if gpu else "auto"
