"""Named grids of training runs, run as separate processes: resumable, within a time budget.

A grid is data: a recipe shared by every run (TrainConfig overrides) and the variants
(regime, K, task loss) to run, each for every seed. Finished runs are skipped, partial
ones resumed, and every run is given the time left, so that it stops after an epoch
and never mid-write when a time budget ends.
"""

import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from infopro.cli import stop_children
from infopro.config import TrainConfig
from infopro.errors import InfoProError
from infopro.grid_status import run_state
from infopro.records import REPO_ROOT, read_json
from infopro.runs import read_metrics, select_by_run_id

PAPER_KS = (2, 4, 8, 16)
SOFTMAX_VARIANTS = tuple(dict(regime="infopro", task_loss="softmax", K=K) for K in PAPER_KS)
TABLE2_VARIANTS = (
    (dict(regime="e2e", K=1),)
    + tuple(dict(regime="greedy", K=K) for K in PAPER_KS)
    + tuple(dict(regime="infopro", task_loss="contrast", K=K) for K in PAPER_KS)
    + SOFTMAX_VARIANTS
)

# DGL (Belilovsky et al., 2020), the baseline row of the paper's Table 2 that its code does not have.
DGL_VARIANTS = tuple(dict(regime="dgl", K=K) for K in PAPER_KS)

# InfoPro*: the memory-balanced splits of Table 3 (ResNet-110), contrastive task term as the paper's commands.
BALANCED_VARIANTS = tuple(dict(regime="infopro", task_loss="contrast", K=K, split="balanced") for K in (2, 3, 4))

CPU_FIXTURE_RECIPE = dict(arch="resnet32", dataset="cifar10-jpeg", train_subset=10000, test_subset=2000,
                          epochs=12, batch_size=128, lr=0.1, warmup_epochs=1)


@dataclass(frozen=True)
class Grid:
    """`recipe` applies to every run; each variant runs once per seed, seed after seed.

    `secondary` variants run at every seed too, but past the grid's first seed only after every
    other run: GPU time is rare, and the runs a result needs come before those that add seeds to
    a configuration it needs only once.
    """

    description: str
    recipe: dict
    variants: tuple[dict, ...]
    seeds: tuple[int, ...] = (0,)
    secondary: tuple[dict, ...] = ()

    def configs(self, seeds=None, only=None, **overrides) -> list[TrainConfig]:
        """Every variant at every seed, in the order they run; with `only`, those whose run id
        contains one of its substrings.

        A seed given twice counts once: two processes would train the same run into one directory.
        """
        seeds, first = dict.fromkeys(self.seeds if seeds is None else seeds), self.seeds[0]
        order = [(seed, variant) for seed in seeds
                 for variant in self.variants + (self.secondary if seed == first else ())]
        order += [(seed, variant) for seed in seeds if seed != first for variant in self.secondary]
        configs = [TrainConfig(**{**self.recipe, **variant, **overrides, "seed": seed}) for seed, variant in order]
        return select_by_run_id(configs, only, TrainConfig.run_id, "configuration of the grid")


def table2_grid(arch: str, description: str) -> Grid:
    """Paper Table 2 on `arch`: E2E, greedy SL and InfoPro (Contrast) at three seeds, the paper's recipe;
    InfoPro (Softmax) at seed 0, and past it after every other run."""
    return Grid(description, dict(arch=arch, dataset="cifar10"), TABLE2_VARIANTS[:-len(SOFTMAX_VARIANTS)],
                seeds=(0, 1, 2), secondary=SOFTMAX_VARIANTS)


GRIDS = {
    "table2-resnet32": table2_grid(
        "resnet32", "Paper Table 2, ResNet-32 on CIFAR-10: E2E, greedy SL, InfoPro (contrast, softmax) at "
        "K=2,4,8,16; the paper's recipe (160 epochs, batch 1024); InfoPro (softmax) past seed 0 runs last"),
    "table2-resnet110": table2_grid(
        "resnet110", "Paper Table 2, ResNet-110 on CIFAR-10: the table2-resnet32 grid on the deeper network (its "
        "E2E run is table3-resnet110's); on one H100 alone an E2E or greedy SL run is about 9 min of steps, "
        "InfoPro (Contrast) K=16 about 22 (the benchmark's step times, ResNet-110, batch 1024, measured while a step "
        "still copied to and from the host)"),
    "table2-dgl-resnet32": Grid(
        "Paper Table 2's DGL row, ResNet-32 on CIFAR-10: DGL at K=2,4,8,16, three seeds, the paper's recipe "
        "(E2E, greedy SL and InfoPro are table2-resnet32's)",
        dict(arch="resnet32", dataset="cifar10"), DGL_VARIANTS, seeds=(0, 1, 2)),
    "table3-resnet110": Grid(
        "Paper Table 3's test errors, ResNet-110 on CIFAR-10: E2E (gradient checkpointing trains the same "
        "network) and InfoPro* (memory-balanced splits) at K=2,3,4; the paper's recipe",
        dict(arch="resnet110", dataset="cifar10"), (dict(regime="e2e", K=1),) + BALANCED_VARIANTS, seeds=(0, 1, 2)),
    "bf16-twins-resnet32": Grid(
        "bf16 against fp32 before bf16 trains a grid: E2E and InfoPro (Contrast) K=4 of table2-resnet32 at seed 0, "
        "in bf16 autocast (their fp32 seeds are table2-resnet32's)",
        dict(arch="resnet32", dataset="cifar10", precision="bf16"),
        (dict(regime="e2e", K=1), dict(regime="infopro", task_loss="contrast", K=4))),
    "cpu-fixture": Grid(
        "Small real fixture made on CPU so that figures build before GPU runs exist: ResNet-32 on "
        "10,000 cifar10-jpeg training images, 12 epochs, batch 128, lr 0.1; E2E, greedy SL, InfoPro "
        "(contrast, softmax) and DGL at K=2,4,8,16",
        CPU_FIXTURE_RECIPE, TABLE2_VARIANTS + DGL_VARIANTS),
    "cpu-schedule-check": Grid(
        "Does the CPU fixture's ordering of greedy SL, InfoPro and DGL hold with a longer schedule? "
        "The cpu-fixture recipe at 36 epochs (3x) for greedy SL, InfoPro (contrast, softmax) and DGL at K=2, 4, 8 "
        "and 16, with E2E as the reference",
        CPU_FIXTURE_RECIPE | dict(epochs=36), TABLE2_VARIANTS + DGL_VARIANTS),
}


def get_grid(name: str) -> Grid:
    if name not in GRIDS:
        raise InfoProError(f"unknown grid {name!r}; valid: {', '.join(GRIDS)}")
    return GRIDS[name]


def train_command(config: TrainConfig, out: Path, device: str, data_root, minutes: float | None = None,
                  step: str = "auto") -> list[str]:
    """The command line (`experiments.train`'s, run as `infopro.train_cli`) that runs (or resumes) `config` into
    `out`, its steps in `step` mode.

    Paths are made absolute: the training runs in the repository root (where `infopro` imports
    from without an install), which need not be where this process was started.
    """
    defaults = TrainConfig()
    command = [sys.executable, "-m", "infopro.train_cli", "--out", str(Path(out).resolve()), "--resume",
               "--device", device, "--step", step]
    if minutes is not None:
        command += ["--time-budget", f"{minutes:.2f}"]
    if data_root is not None:
        command += ["--data-root", str(Path(data_root).resolve())]
    for name, value in config.__dict__.items():
        if value is None or (value == getattr(defaults, name) and name not in ("regime", "dataset")):
            continue
        flag = "--" + name.replace("_", "-")
        command += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    return command


class RunsFailed(InfoProError):
    """Trainings of a grid that ended with an error (the others ran on)."""

    exit_code = 1


@dataclass(frozen=True)
class GridOutcome:
    """What one call of `run_grid` leaves: each run's state ('done', 'partial (e/E epochs)', 'missing'),
    the runs whose training failed (run id -> exit code and last log line) and the runs the time
    budget left unstarted."""

    states: dict[str, str]
    failed: dict[str, str]
    unstarted: list[str]


START_SECONDS = 60  # a run starts only with more left: decoding the data and building the model take seconds


def run_grid(configs: list[TrainConfig], root: Path, *, jobs: int = 1, time_budget: float | None = None,
             device: str = "auto", data_root=None, step: str = "auto", log=print) -> GridOutcome:
    """Run every unfinished config, `jobs` at a time, their steps in `step` mode (`experiments.train --step`).

    Each run's output goes to `root/logs/<run id>.log`. A run that fails is reported with the last line of
    its log and does not stop the others. A run starts only with more than `START_SECONDS` of the budget
    left; how many that leaves unstarted is logged.
    """
    deadline = None if time_budget is None else time.monotonic() + time_budget
    pending = [c for c in configs if run_state(c, root) != "done"]
    log(f"{len(configs) - len(pending)} of {len(configs)} runs done; {len(pending)} to run, {jobs} at a time")
    running: dict[subprocess.Popen, TrainConfig] = {}
    failed = {}
    (root / "logs").mkdir(parents=True, exist_ok=True)
    try:
        while pending or running:
            left = None if deadline is None else deadline - time.monotonic()
            while pending and len(running) < jobs and (left is None or left > START_SECONDS):
                config = pending.pop(0)
                minutes = None if left is None else left / 60
                logfile = open(root / "logs" / f"{config.run_id()}.log", "a")
                command = train_command(config, root / config.run_id(), device, data_root, minutes, step)
                running[subprocess.Popen(command, cwd=REPO_ROOT, stdout=logfile, stderr=subprocess.STDOUT)] = config
                logfile.close()
                log(f"started {config.run_id()}")
            if left is not None and left <= START_SECONDS and not running:
                break
            time.sleep(1)
            for process in [p for p in running if p.poll() is not None]:
                config = running.pop(process)
                detail = ""
                if process.returncode != 0:
                    failed[config.run_id()] = f"exit {process.returncode}: {last_line(root, config)}"
                    detail = f" ({failed[config.run_id()]})"
                log(f"{config.run_id()}: {run_state(config, root)}{detail}")
    finally:
        stop_children(list(running))
    if pending:
        log(f"the time budget left {len(pending)} runs unstarted (a run starts only with more than a minute left)")
    return GridOutcome({c.run_id(): run_state(c, root) for c in configs}, failed, [c.run_id() for c in pending])


def last_line(root: Path, config: TrainConfig) -> str:
    lines = (root / "logs" / f"{config.run_id()}.log").read_text().strip().splitlines()
    return lines[-1] if lines else "no output"


# Epochs of each measuring run: the first (compilation, autotuning) is left out, and the copies' starts, data
# decoding included, spread over seconds; on an H200 four epochs of two copies ended before both were past their first.
MEASURED_EPOCHS = 12


def measure_jobs(config: TrainConfig, counts: list[int], folder, device: str = "auto", data_root=None,
                 epochs: int = MEASURED_EPOCHS, step: str = "auto") -> tuple[list[dict], dict]:
    """Aggregate training images/s with N copies of `config` running at once, for each N in `counts`.

    One training alone leaves a large GPU partly idle (small kernels, Python between them);
    several share it until they only compete. For each N, N identical `epochs`-epoch runs start
    together, and their images/s are counted only over the window in which all N train in their
    steady state (`steady_window`): a run's first epoch (compilation, cuDNN autotuning) and the
    time after the first run ends, when fewer share the GPU, are left out. The best N is the
    `--jobs` to give the grid. Returns one row per N, the best marked, and the provenance the
    measuring runs recorded: the numerics they trained with (cuDNN autotuning, TF32, step mode)
    are set by each training, never by the process that starts them.
    """
    short = replace(config, epochs=epochs)
    Path(folder).mkdir(parents=True, exist_ok=True)
    rows = []
    for n in counts:
        runs = [Path(folder) / f"jobs{n}-run{i}" for i in range(n)]
        processes = []
        try:
            for run in runs:
                with open(run.with_suffix(".log"), "w") as log:
                    processes.append(subprocess.Popen(train_command(short, run, device, data_root, step=step),
                                                      cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT))
            for process, run in zip(processes, runs):
                if process.wait():
                    lines = run.with_suffix(".log").read_text().strip().splitlines()
                    raise InfoProError(f"a measuring run failed: {lines[-1] if lines else 'no output'}")
        finally:
            stop_children(processes)
        images = read_json(runs[0] / "config.json")["dataset"]["train_size"]
        window, trained = steady_window([read_metrics(run, ("epoch_seconds", "ended_at")) for run in runs], images)
        rows.append({"jobs": n, "images_per_second": trained / window,
                     "images_per_second_per_run": trained / window / n, "window_seconds": window})
    best = max(rows, key=lambda row: row["images_per_second"])["jobs"]
    trained_with = read_json(Path(folder) / f"jobs{counts[0]}-run0" / "config.json")["provenance"]
    return [row | {"best": row["jobs"] == best} for row in rows], trained_with


def steady_window(metrics: list, images: int) -> tuple[float, float]:
    """(seconds, training images) of the window in which every run of `metrics` (their metrics.csv) was
    past its first epoch and none had ended: from the latest end of a first epoch to the earliest end
    of a last one. An epoch partly inside counts in proportion to its time inside."""
    start = max(m["ended_at"].iloc[0] for m in metrics)
    end = min(m["ended_at"].iloc[-1] for m in metrics)
    if end - start <= 0:
        raise InfoProError("the measuring runs never all trained past their first epoch at once; give them more "
                           "epochs")
    trained = 0.0
    for m in metrics:
        for ended, seconds in zip(m["ended_at"], m["epoch_seconds"]):
            inside = min(ended, end) - max(ended - seconds, start)
            trained += images * max(inside, 0.0) / seconds
    return end - start, trained
