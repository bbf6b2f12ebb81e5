"""Seconds per ResNet-32 training epoch in each step mode (eager, compiled) and precision, for the grid.

    python -m experiments.bench_epochs --dataset cifar10-jpeg --data-root .data --time-budget 3   # a GPU
    python -m experiments.bench_epochs --dataset synthetic --quick --modes eager    # a CPU smoke run

For E2E, greedy SL K = 4 and InfoPro (Contrast) K = 4 and 16 at the paper's recipe (batch 1024, the
whole training set), each measured in a fresh process, `--epochs` epochs of which the first is left
out of the pace (`infopro.epoch_bench`). Rows go to results/bench/epoch-resnet32-<device>.csv as each
is measured; a call continues a file of the same device, measuring only what it lacks (the GPU plan
gives it 3 minutes a call: a compiled measurement's first epoch compiles every module, minutes for
InfoPro K = 16). The grid trains in the fastest fp32 mode measured there (`experiments.stages`).
"""

import time
from pathlib import Path

from infopro.cli import ArgumentParser, at_least, positive, run
from infopro.config import PRECISIONS, TrainConfig
from infopro.data import DATASETS, dataset_source
from infopro.device import resolve_device
from infopro.epoch_bench import EPOCH_METHODS, EPOCH_MODES, epoch_rows, short_recipe
from infopro.grid import get_grid
from infopro.records import check_writable, device_slug, read_table, write_csv
from infopro.step import epoch_csv

QUICK = dict(train_subset=256, test_subset=64, batch_size=64)  # a CPU smoke run


def epoch_table_path(out, device) -> Path:
    return epoch_csv(Path(out), device_slug(device))


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.bench_epochs", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cifar10", choices=DATASETS)
    p.add_argument("--data-root", help="folder or archive of the dataset (default: data/ or .data/)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--modes", nargs="+", default=list(EPOCH_MODES), choices=EPOCH_MODES)
    p.add_argument("--precisions", nargs="+", default=["fp32"], choices=PRECISIONS)
    p.add_argument("--epochs", type=at_least(2), default=3, help="epochs per measurement, the first left out "
                                                                 "of the pace (default: 3)")
    p.add_argument("--time-budget", type=positive, metavar="MIN",
                   help="start no measurement after MIN minutes; a later call measures the rest")
    p.add_argument("--quick", action="store_true", help="256 images, batch 64: a smoke run (CPU, CI)")
    p.add_argument("--out", default="results/bench", help="folder of the CSV")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = resolve_device(args.device)
    dataset_source(args.dataset, args.data_root)  # missing data: one line before any process starts
    check_writable(args.out)
    recipe = TrainConfig(**get_grid("table2-resnet32").recipe | {"dataset": args.dataset}
                         | (QUICK if args.quick else {}))
    path = epoch_table_path(args.out, device)
    rows = read_table(path, "delete it to measure again").to_dict("records") if path.is_file() else []
    done = {(row["method"], row["K"], row["mode"], row["precision"]) for row in rows}
    context = {"arch": recipe.arch, "dataset": recipe.dataset, "batch_size": recipe.batch_size}
    began = time.monotonic()
    for row in epoch_rows(short_recipe(recipe, args.epochs), EPOCH_METHODS, args.modes, args.precisions,
                          device.type, args.data_root, done):
        rows.append(row | context)
        write_csv(path, rows)
        if args.time_budget and time.monotonic() - began >= 60 * args.time_budget:
            print(f"{args.time_budget:g} min spent: the measurements left wait for the next call")
            break
    print(f"wrote {path}")


if __name__ == "__main__":
    run(main)
