"""Run a named grid of trainings (separate processes), skipping finished runs, resuming partial ones.

    python -m experiments.grid table2-resnet32 --seeds 0 1 2 --jobs 3 --time-budget 25 --out results/runs
    python -m experiments.grid table2-resnet32 --status --out results/runs
    python -m experiments.grid cpu-fixture --data-root ../shared/data --out results/runs

`table2-resnet32` feeds Table 2 and fig7 (13 configurations per seed, the paper's 160-epoch
recipe; GPU hours, see README). `cpu-fixture` is the small real fixture committed so that the
figures build on a machine without a GPU (2.3 h of training on 2 CPU cores, measured).
"""

from pathlib import Path

from infopro.cli import ArgumentParser, run
from infopro.data import DATASETS
from infopro.grid import GRIDS, get_grid, run_grid, run_state


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.grid", description=__doc__.split("\n\n")[0])
    p.add_argument("grid", choices=GRIDS)
    p.add_argument("--seeds", type=int, nargs="+", help="seeds to run (default: the grid's)")
    p.add_argument("--dataset", choices=DATASETS, help="override the grid's dataset")
    p.add_argument("--jobs", type=int, default=1, help="trainings to run at once (on one GPU: measure)")
    p.add_argument("--time-budget", type=float, metavar="MIN", help="stop cleanly within MIN minutes")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-root")
    p.add_argument("--out", default="results/runs", help="folder holding one directory per run")
    p.add_argument("--status", action="store_true", help="list done / partial / missing runs and exit")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    grid = get_grid(args.grid)
    overrides = {"dataset": args.dataset} if args.dataset else {}
    configs = grid.configs(args.seeds, **overrides)
    root = Path(args.out)
    if args.status:
        for config in configs:
            print(f"{run_state(config, root):<24} {config.run_id()}")
        return
    budget = None if args.time_budget is None else 60 * args.time_budget
    states = run_grid(configs, root, jobs=args.jobs, time_budget=budget, device=args.device,
                      data_root=args.data_root)
    done = sum(state == "done" for state in states.values())
    print(f"{done} of {len(states)} runs done")


if __name__ == "__main__":
    run(main)
