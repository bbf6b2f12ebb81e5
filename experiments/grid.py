"""Run a named grid of trainings (separate processes), skipping finished runs, resuming partial ones.

    python -m experiments.grid table2-resnet32 --seeds 0 1 2 --jobs 3 --time-budget 25 --out results/runs
    python -m experiments.grid table2-resnet32 --dataset cifar10-jpeg --status   # the committed runs
    python -m experiments.grid cpu-fixture --seeds 2 --only K2- --out results/runs    # some configurations
    python -m experiments.grid cpu-fixture --data-root .data --out results/runs
    python -m experiments.grid table2-resnet32 --measure-jobs 1 2 3 4 6     # which --jobs fills the GPU

`--measure-jobs` runs N copies of the grid's first configuration at once for 12 epochs, for each
N, and writes their aggregate images/s over the window in which all N trained past their first
epoch to results/bench/grid-jobs-<grid>-<device>.csv.
`table2-resnet32` feeds Table 2 and fig7 (13 configurations per seed, the paper's 160-epoch
recipe; on one H100, four runs at a time, 9 to 13 min per run of E2E, greedy SL and InfoPro at
K = 2, about 17, 30 and 64 min for InfoPro (Contrast) at K = 4, 8, 16 and 13, 18 and 33 min for
InfoPro (Softmax) at K = 4, 8, 16, from the committed runs' epochs, all measured while a step still
copied to and from the host (docs/training.md); `--status` adds up what is left).
`cpu-fixture` is the small real fixture committed so that the figures build on a machine without a
GPU (3.3 h of training on 2 CPU cores, measured);
`cpu-schedule-check` trains E2E, greedy SL, both InfoPro variants and DGL at K=2, 4, 8 and 16 for 3x the epochs
(README).
`table2-resnet110` is table2-resnet32 on ResNet-110; `table3-resnet110` trains E2E and InfoPro*
(balanced splits, K=2, 3, 4), whose errors Table 3 shows beside the memory benchmark.
"""

import tempfile
from pathlib import Path

from infopro.bench import write_measurement
from infopro.cli import ArgumentParser, at_least, positive, run
from infopro.data import DATASETS, dataset_source
from infopro.device import resolve_device
from infopro.errors import InfoProError
from infopro.grid import GRIDS, MEASURED_EPOCHS, RunsFailed, get_grid, measure_jobs, run_grid
from infopro.grid_status import grid_status, run_state, status_summary
from infopro.records import check_writable, device_slug
from infopro.step import STEP_MODES


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.grid", description=__doc__.split("\n\n")[0])
    p.add_argument("grid", choices=GRIDS)
    p.add_argument("--seeds", type=int, nargs="+", help="seeds to run (default: the grid's)")
    p.add_argument("--only", nargs="+", metavar="TEXT",
                   help="only the configurations whose run id contains one of these (e.g. K2-)")
    p.add_argument("--dataset", choices=DATASETS, help="override the grid's dataset")
    p.add_argument("--jobs", type=at_least(1), default=1,
                   help="trainings to run at once (on one GPU: pick with --measure-jobs)")
    p.add_argument("--time-budget", type=positive, metavar="MIN", help="stop cleanly within MIN minutes")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--step", default="auto", choices=STEP_MODES,
                   help="each training's step mode (experiments.train --step; default: auto, the faster on this "
                        "GPU model by its epoch benchmark, else eager)")
    p.add_argument("--data-root")
    p.add_argument("--out", default="results/runs", help="folder holding one directory per run")
    p.add_argument("--status", action="store_true",
                   help="list done / partial / missing runs (test error, time left) and exit")
    p.add_argument("--lease-minutes", type=positive, metavar="MIN",
                   help="with --status: also count the GPU leases of MIN device-minutes the rest needs at least")
    p.add_argument("--measure-jobs", type=at_least(1), nargs="+", metavar="N",
                   help="measure aggregate images/s with N trainings at once (each N in turn) and exit")
    p.add_argument("--bench-out", default="results/bench", help="folder of the benchmarks: --measure-jobs writes "
                   "its CSV there, --status reads the epoch benchmarks there")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    grid = get_grid(args.grid)
    root = Path(args.out)
    if root.exists() and not root.is_dir():
        raise InfoProError(f"--out {root} is a file; give the folder that holds (or will hold) one directory per run")
    if args.status and not root.is_dir():
        raise InfoProError(f"{root}: no such folder of runs")
    dataset = args.dataset or (dataset_here(grid, args, root) if args.status else None)
    configs = grid.configs(args.seeds, args.only, **({"dataset": dataset} if dataset else {}))
    if args.status:
        print_status(configs, root, Path(args.bench_out), args.lease_minutes)
        return
    if args.measure_jobs:
        report_jobs(args, configs[0])
        return
    if any(run_state(config, root) != "done" for config in configs):
        dataset_source(configs[0].dataset, args.data_root)  # missing data: one line, not one failure per run
    budget = None if args.time_budget is None else 60 * args.time_budget
    outcome = run_grid(configs, root, jobs=args.jobs, time_budget=budget, device=args.device,
                       data_root=args.data_root, step=args.step)
    done = sum(state == "done" for state in outcome.states.values())
    print(f"{done} of {len(configs)} runs done" + ("" if done == len(configs) else "; run the command again to continue"))
    if outcome.failed:
        raise RunsFailed(f"{len(outcome.failed)} of {len(configs)} runs failed: {', '.join(outcome.failed)} "
                         f"(the last line of each is above; their logs are in {root / 'logs'})")


def dataset_here(grid, args, root: Path) -> str | None:
    """For --status without --dataset: the dataset whose runs of the grid `root` holds, when the grid's
    own has none there and exactly one other has some (said in one line); else None, the grid's own."""
    def started(dataset):
        return sum(run_state(config, root) != "missing" for config in grid.configs(args.seeds, args.only,
                                                                                 dataset=dataset))
    own = grid.configs(args.seeds, args.only)[0].dataset
    if started(own):
        return None
    others = [dataset for dataset in DATASETS if dataset != own and started(dataset)]
    if len(others) != 1:
        return None
    print(f"no {own} run of {args.grid} in {root}; showing its {others[0]} runs (--dataset picks one)")
    return others[0]


def print_status(configs, root: Path, bench: Path, lease_minutes: float | None = None) -> None:
    """One line per run: its state, its id and, where there is one, its error or its time left;
    then how many runs are in each state, the minutes of training left in all and the GPU time they need
    (from the runs' shares of their GPU, else the epoch benchmarks under `bench`)."""
    statuses = grid_status(configs, root, bench)
    for config, status in zip(configs, statuses):
        print(f"{status.state:<24} {config.run_id()}" + (f": {status.detail}" if status.detail else ""))
    print("\n".join(status_summary(statuses, lease_minutes)))


def report_jobs(args, config) -> None:
    """Measure which number of concurrent trainings gives the most images/s; write and print it."""
    device = resolve_device(args.device)
    dataset_source(config.dataset, args.data_root)
    check_writable(args.bench_out)
    with tempfile.TemporaryDirectory(prefix="infopro-jobs-") as folder:
        rows, trained_with = measure_jobs(config, args.measure_jobs, folder, device.type, args.data_root,
                                          step=args.step)
    context = {"grid": args.grid, "run_id": config.run_id(), "measured_epochs": MEASURED_EPOCHS} | trained_with
    path = Path(args.bench_out) / f"grid-jobs-{args.grid}-{device_slug(device)}.csv"
    write_measurement(path, rows, context)


if __name__ == "__main__":
    run(main)
