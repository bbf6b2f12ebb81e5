"""Everything this repository needs a GPU for, as stages run in order of value within a time budget.

The GPU-lease workflow behind `python -m experiments.reproduce`, kept at the edge of the
repository: the library knows nothing of leases. GPU time comes in short leases, so the work is
cut into stages, each skipped once the file it writes exists (grids resume their partial runs):
calling again continues where the last call stopped. The measurements come first (seconds per
epoch in each step mode, which decides the mode every grid trains in; the Table 3 benchmark and
the input pipeline, module-parallel throughput, the max-batch search, the profiles, the
re-timing), then the project's order of training and analysis: the remainder estimator's budget
and its estimates of the seed-0 E2E and greedy SL networks (the paper's figure; then E2E's points
again with a longer budget, to see whether the budget shapes its curve), how many
trainings at once fill the GPU (the grid's --jobs, measured just before the grids), DGL's seed-0
row, the unfinished runs of Table 2, the other seed-0 networks' estimates (each network's key
layer points first: layer 1, its module ends and its last; the points between module ends after
every network's key points), the remaining seeds of Table 2 and DGL, then bf16 twins of two fp32
runs (evidence before bf16 trains any grid) and Table 3's steps timed compiled, as the grids train.
A lent machine is lost with everything on it, so a call can pack what it wrote for the way back
(`experiments.travel.pack`). How long a remainder pass takes, and which of a network's layer points
fit a call, is `experiments.remainder_plan`'s; which measurements exist, and what they decide (the
grids' jobs and step mode), `experiments.measured`'s. The other analyses of finished runs (probes,
the 1c2f estimates) run on a CPU as well (`make probes mutual-info figures tables`).
"""

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from experiments.measured import (PIPELINE, STEP_TABLE, adds_to, best_jobs, epochs_measured, gpu_files, profiled,
                                  retimed, steady_jobs_tables, training_step_mode)
from experiments.remainder_plan import (ceiling_measured, longer_ceiling_measured, missing_points, network_points,
                                       points_progress, points_that_fit, remainder_minutes, remainder_step, steps_table)
from infopro.cli import call
from infopro.errors import InfoProError
from infopro.grid import START_SECONDS, get_grid
from infopro.grid_status import RunStatus, grid_status, run_state, status_summary
from infopro.records import REPO_ROOT, UNKNOWN
from infopro.remainder_steps import steps_csv

GRID, GRID_DATASET = "table2-resnet32", "cifar10-jpeg"
DGL_GRID = "table2-dgl-resnet32"  # the baseline row of Table 2: after GRID, which takes the time left
BF16_GRID = "bf16-twins-resnet32"  # evidence for bf16 before any new grid trains in it: after every fp32 run
MAX_BATCH_METHODS = ("e2e", "checkpoint", "greedy:4", "infopro:4", "infopro:16",
                     "infopro-balanced:2", "infopro-balanced:3", "infopro-balanced:4")
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
# The budget check: E2E's I(h,y) at the figure's budget rises 2.26 points from its lowest layer point (8) to
# its last (16), and starts at layer 1 near the ceiling; with twice the budget, a rise that comes from the
# budget alone shrinks (`infopro.remainder_budget`). It belongs to the paper's figure, so E2E's runs beside
# it. InfoPro (Contrast) K = 2's follows the other methods' estimates: on the CPU fixture twice the budget
# lifted its module end (layer 8) twice as much as E2E's and greedy SL's (results/NOTES.md), which bears on
# whether InfoPro keeps I(h,y) there. The second costs its points alone: the ceiling is the recipe's.
BUDGET_LAYERS, BUDGET_TIMES = (1, 8, 16), 2
BUDGET_FIRST, BUDGET_LATER = ("e2e-K1",), ("infopro-contrast-K2",)
REMAINDER_LATER = tuple(f"{method}-K{K}" for method in ("infopro-contrast", "infopro-softmax", "dgl")
                        for K in (2, 4, 8, 16))


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


PYTHON = [sys.executable, "-m"]
REMAINDER = PYTHON + ["analysis.remainder"]


@dataclass(frozen=True)
class Where:
    """Where a plan's stages read and write (absolute paths: the commands run in the repository root), the
    `--data-root` option of the dataset's copy, if any, and the GPU they run on (a device slug; None when
    only planning)."""

    bench: Path
    runs: Path
    ceilings: Path  # the remainder estimator's budget
    mi: Path  # its rows, beside the 1c2f estimator's
    budget: Path  # its budget check's rows
    root: tuple[str, ...]
    gpu: str | None

    @classmethod
    def of(cls, results: Path, data_root: str | None, gpu: str | None) -> "Where":
        results = results.resolve()
        root = ("--data-root", str(Path(data_root).resolve())) if data_root else ()
        return cls(results / "bench", results / "runs", results / "analysis" / "remainder_ceiling.csv",
                   results / "analysis" / "mutual_information.csv", results / "analysis" / "remainder_budget.csv",
                   root, gpu)

    @property
    def data(self) -> list[str]:
        """The options of a command that reads the JPEG copy."""
        return ["--dataset", GRID_DATASET, *self.root]


def stages(results: Path, data_root: str | None, gpu: str | None = None) -> list[Stage]:
    """The GPU stages in the order they run; `results` is the repository's results/ folder and `gpu`
    the device slug of the GPU they will run on (None when only planning)."""
    where = Where.of(results, data_root, gpu)
    unfinished = [config.run_id() for config in get_grid(GRID).configs(dataset=GRID_DATASET)
                  if run_state(config, where.runs).startswith("partial")]
    return [
        *benchmark_stages(where),
        ceiling_stage(where),
        *remainder_steps_stages(where),
        *key_point_stages(where, REMAINDER_FIRST),
        *budget_stages(where, BUDGET_FIRST),
        grid_jobs_stage(where),
        grid_stage(where, "dgl-seed0", DGL_GRID, seeds=(0,)),
        *([grid_stage(where, "table2-unfinished", GRID, only=unfinished)] if unfinished else []),
        *key_point_stages(where, REMAINDER_LATER),
        *budget_stages(where, BUDGET_LATER),
        *between_stages(where, REMAINDER_FIRST + REMAINDER_LATER),
        grid_stage(where, "table2", GRID),
        grid_stage(where, "dgl", DGL_GRID),
        grid_stage(where, "bf16-twins", BF16_GRID),
        table3_compiled_stage(where),
    ]


def benchmark_stages(where: Where) -> list[Stage]:
    """The measurements that come before any training: seconds per epoch in each step mode (which decides
    the mode the grids train in), Table 3 and the input pipeline, module-parallel throughput, the max-batch
    search, the profiles and the re-timing."""
    bench, gpu = where.bench, where.gpu
    return [
        Stage("epoch-bench", "seconds per ResNet-32 epoch, eager and compiled steps, fp32: E2E, greedy SL K = 4, "
                             "InfoPro (Contrast) K = 4 and 16 (the grids train in the faster mode)",
              lambda: epochs_measured(bench, gpu),
              lambda left: PYTHON + ["experiments.bench_epochs", *where.data, "--out", str(bench),
                                     "--time-budget", f"{min(EPOCH_BENCH_MINUTES, left):.1f}"],
              minutes=EPOCH_BENCH_MINUTES),
        Stage("table3", "every method's step time and memory, ResNet-110, batch 1024, fp32; our input "
                        "pipeline against a DataLoader",
              lambda: bool(gpu_files(bench, f"{STEP_TABLE}*.csv") and gpu_files(bench, f"{PIPELINE}*.csv")),
              lambda left: PYTHON + ["experiments.bench", "--measure", "steps", "pipeline", "--out", str(bench)],
              minutes=8),
        Stage("module-parallel", "images/s of one rank per module against the synchronous trainer, K = 2, 4",
              lambda: bool(gpu_files(bench, "module-parallel-resnet32-infopro-b1024-*.csv")),
              lambda left: PYTHON + ["experiments.bench_module_parallel", "--device", "cuda", "--batch-size", "1024",
                                     "--train-subset", "50000", *where.data, "--out", str(bench)],
              minutes=5),
        Stage("max-batch", "largest batch under 2, 4 and 8 GiB, ResNet-110",
              lambda: bool(gpu_files(bench, "resnet110-fp32-*-maxbatch.csv")),
              lambda left: PYTHON + ["experiments.bench", "--measure", "max-batch", "--caps", "2,4,8",
                                     "--methods", *MAX_BATCH_METHODS, "--out", str(bench)],
              minutes=10),
        Stage("profile", "the operators a step's time goes to and where the GPU's idle time goes, ResNet-110, "
                         "batch 1024: E2E, checkpointing, greedy SL, InfoPro and InfoPro* at K = 4, InfoPro at K = 16",
              lambda: profiled(bench, gpu),
              lambda left: PYTHON + ["experiments.bench", "--measure", "profile", "--steps", "5",
                                     "--methods", *PROFILE_METHODS, "--out", str(bench)],
              minutes=3),
        Stage("profile-resnet32", "where a ResNet-32 E2E step's time goes, batch 1024 (the goal of an epoch in "
                                  "0.5 s): its operators and the GPU's idle time",
              lambda: adds_to(bench, PIPELINE, gpu,
                              lambda slug: (bench / f"idle-resnet32-b1024-fp32-{slug}.csv").is_file()),
              lambda left: PYTHON + ["experiments.bench", "--arch", "resnet32", "--measure", "profile", "--steps", "5",
                                     "--methods", "e2e", "--out", str(bench)],
              minutes=1),
        Stage("retime", "every method's step time again with the current training step, ResNet-110, batch "
                        "1024, fp32, and our input pipeline against a DataLoader (both first timed with host "
                        "copies in a step)",
              lambda: retimed(bench, gpu),
              lambda left: PYTHON + ["experiments.bench", "--measure", "steps", "pipeline",
                                     "--out", str(bench / "remeasured")],
              minutes=6),  # as table3, which took 5.7 min on an H100
    ]


def ceiling_stage(where: Where) -> Stage:
    """The remainder estimator's budget, measured against E2E's network."""
    return Stage("remainder-ceiling", "the remainder estimator's budget: a ResNet-32 trained from the image with "
                                      f"{', '.join(map(str, REMAINDER_CANDIDATES))} epochs until one comes within 2 "
                                      "points of E2E's test accuracy",
                 lambda: ceiling_measured(where.ceilings, REMAINDER_REFERENCE, REMAINDER_CANDIDATES),
                 lambda left: REMAINDER + ["ceiling", "--reference", REMAINDER_REFERENCE, "--candidates",
                                           *map(str, REMAINDER_CANDIDATES), "--runs", str(where.runs),
                                           "--ceilings", str(where.ceilings), *where.root],
                 minutes=3)  # unmeasured: at most 135 epochs of one ResNet-32, about 1 s each on an H100


def remainder_steps_stages(where: Where) -> list[Stage]:
    """The remainder passes' step mode, timed on E2E's network where its weights are here."""
    bench, gpu, weights = where.bench, where.gpu, where.runs / REMAINDER_REFERENCE / "model.pt"
    measured = (lambda: steps_table(bench, gpu) is not None) if gpu else (
        lambda: bool(gpu_files(bench, steps_csv(bench, "*").name)))
    return [Stage("remainder-steps", "seconds per epoch of a remainder pass over E2E's layer points, eager "
                                     "against CUDA-graphed steps (the passes after it take the faster that agrees)",
                  measured,
                  lambda left: REMAINDER + ["steps", "--reference", REMAINDER_REFERENCE, "--runs", str(where.runs),
                                            "--out", str(bench), *where.root],
                  minutes=2,  # unmeasured: the data, two epochs of 10,500 images in each mode, sixteen captures
                  reads=lambda: [weights])] if weights.is_file() else []


def remainder_stage(where: Where, name: str, what: str, run_id: str, points: list[int]) -> Stage:
    """The remainder estimator on the layer `points` of `run_id`: each call estimates those of them that
    fit (`points_that_fit`), and packs after (`run_stages`'s `after`)."""
    def missing():
        return missing_points(where.mi, run_id, points)

    def pass_minutes(some: list[int]) -> float:
        return remainder_minutes(where.mi, where.ceilings, where.bench, where.gpu, some, REMAINDER_REFERENCE)

    return Stage(name, f"I(h,y), I(h,x) in the paper's units at {what} of {run_id}", lambda: not missing(),
                 lambda left: REMAINDER + ["layers", "--only", run_id, "--layers", ",".join(
                     map(str, points_that_fit(missing(), pass_minutes, left))),
                     "--runs", str(where.runs), "--ceilings", str(where.ceilings), "--out", str(where.mi),
                     "--step", remainder_step(where.bench, where.gpu), *where.root],
                 minutes=lambda: pass_minutes(missing()[:1]), progress=lambda: points_progress(missing(), points),
                 reads=lambda: [where.runs / run_id / "model.pt"])


def budget_stages(where: Where, networks: tuple[str, ...]) -> list[Stage]:
    """The remainder estimator's budget check on each seed-0 network of `networks` whose weights are here:
    BUDGET_LAYERS again with BUDGET_TIMES the figure's budget, and the recipe's ceiling there unless measured."""
    return [budget_stage(where, network, run_id) for network, run_id, *_ in with_weights(where, networks)]


def budget_stage(where: Where, network: str, run_id: str) -> Stage:
    def minutes() -> float:
        passes = [list(BUDGET_LAYERS)] + [[0]] * (not longer_ceiling_measured(where.ceilings, REMAINDER_REFERENCE,
                                                                                BUDGET_TIMES))  # 0: the ceiling
        return sum(remainder_minutes(where.mi, where.ceilings, where.bench, where.gpu, points, REMAINDER_REFERENCE,
                                     BUDGET_TIMES) for points in passes)

    return Stage(f"remainder-budget:{network}", f"layers {', '.join(map(str, BUDGET_LAYERS))} of {run_id} and the "
                                                f"ceiling again with {BUDGET_TIMES} times the figure's budget",
                 lambda: not missing_points(where.budget, run_id, list(BUDGET_LAYERS)),
                 lambda left: REMAINDER + ["budget", "--reference", run_id, "--layers",
                                           ",".join(map(str, BUDGET_LAYERS)), "--runs", str(where.runs),
                                           "--ceilings", str(where.ceilings), "--out", str(where.budget),
                                           "--figure", str(where.mi),
                                           "--step", remainder_step(where.bench, where.gpu), *where.root],
                 minutes=minutes, reads=lambda: [where.runs / run_id / "model.pt"])


def with_weights(where: Where, networks: tuple[str, ...]):
    """(network, run id, key layer points, the points between them) of each seed-0 network whose weights
    are here (`network_points`)."""
    for network in networks:
        run_id = f"{GRID_DATASET}-resnet32-{network}-s0"
        if (where.runs / run_id / "model.pt").is_file():
            yield network, run_id, *network_points(network)


def key_point_stages(where: Where, networks: tuple[str, ...]) -> list[Stage]:
    """One stage per network for its key layer points, which the paper's claims are read at."""
    return [remainder_stage(where, f"remainder:{network}", "layer 1, the module ends and layer 16" if between
                            else "every layer", run_id, key)
            for network, run_id, key, between in with_weights(where, networks)]


def between_stages(where: Where, networks: tuple[str, ...]) -> list[Stage]:
    """One stage per network for the layer points between its module ends (none for E2E)."""
    return [remainder_stage(where, f"remainder-between:{network}", "the layers between module ends", run_id, between)
            for network, run_id, _, between in with_weights(where, networks) if between]


def grid_jobs_stage(where: Where) -> Stage:
    """How many trainings at once the grids run, measured just before them."""
    return Stage("grid-jobs", f"how many trainings at once fill the GPU ({GRID}), counted while all of them train",
                 lambda: bool(steady_jobs_tables(where.bench, GRID, where.gpu)),
                 lambda left: PYTHON + ["experiments.grid", GRID, *where.data, "--measure-jobs", "1", "2", "4",
                                        "--step", training_step_mode(where.bench, where.gpu),
                                        "--bench-out", str(where.bench)],
                 minutes=3)


def grid_stage(where: Where, name: str, grid_name: str, seeds: tuple[int, ...] | None = None,
               only: list[str] | None = None) -> Stage:
    """A grid of trainings on the JPEG copy (`seeds`, default every one; `only`: those run ids), as many at
    once as the GPU's measured best, in its fastest step mode."""
    bench, runs, gpu = where.bench, where.runs, where.gpu
    configs = get_grid(grid_name).configs(seeds=seeds, only=only, dataset=GRID_DATASET)
    which = "the unfinished runs" if only else "every seed" if seeds is None else f"seed {', '.join(map(str, seeds))}"
    return Stage(name, f"the {grid_name} grid on {GRID_DATASET}, {which}, resumable",
                 lambda: all(run_state(config, runs) == "done" for config in configs),
                 lambda left: PYTHON + ["experiments.grid", grid_name, *where.data,
                                        "--jobs", str(best_jobs(bench, GRID, gpu)),
                                        "--step", training_step_mode(bench, gpu),
                                        "--time-budget", f"{left:.1f}", "--out", str(runs)]
                 + (["--seeds", *map(str, seeds)] if seeds else []) + (["--only", *only] if only else []),
                 minutes=lambda: grid_minutes(grid_status(configs, runs, bench)),
                 progress=lambda: status_summary(grid_status(configs, runs, bench)),
                 reads=lambda: [path for path in (runs / config.run_id() / "checkpoint.pt" for config in configs)
                                if path.is_file() and not (path.parent / "summary.json").is_file()])


GRID_MINUTES = 2  # a run's start and a minute of its training: the least a grid stage is worth starting for


def grid_minutes(statuses: list[RunStatus]) -> float:
    """The minutes a grid stage needs: `GRID_MINUTES`, or less where an unfinished run's time left at its
    recent pace is shorter than a minute: that run finishes in the grid's start margin plus its time left."""
    known = [status.minutes_left for status in statuses if status.minutes_left is not None]
    return min([GRID_MINUTES] + [START_SECONDS / 60 + minutes for minutes in known])


def table3_compiled_stage(where: Where) -> Stage:
    """Table 3's InfoPro* and E2E steps timed with compiled modules, beside the eager step table."""
    bench = where.bench
    return Stage("table3-compiled", "step times with each local module compiled (the grids' training mode), "
                                    f"ResNet-110, batch 1024, fp32, beside the eager step table: "
                                    f"{', '.join(COMPILED_METHODS)}",
                 lambda: adds_to(bench, STEP_TABLE, where.gpu,
                                 lambda slug: (bench / "compiled" / f"{STEP_TABLE}{slug}.csv").is_file()),
                 lambda left: PYTHON + ["experiments.bench", "--measure", "steps", "--step", "compiled",
                                        "--methods", *COMPILED_METHODS, "--out", str(bench)],
                 minutes=10)  # unmeasured: mostly compiling, a ResNet-32's modules took 1 to 3 min on a CPU


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
