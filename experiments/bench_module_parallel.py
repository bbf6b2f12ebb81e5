"""Throughput of module-parallel training against the synchronous trainer, and what K devices would give.

    python -m experiments.bench_module_parallel                         # K = 2, 4; CPU-sized, gloo
    python -m experiments.bench_module_parallel --device cuda --batch-size 1024 --train-subset 50000

For each K: images/s of the last of two epochs of the synchronous trainer and of the pipeline
(one rank per module) at each --staleness, same config and device, in one invocation; beside
them the measured compute time of each module's step and the ideal pipeline speed-up on K
devices it implies (sum over modules / slowest module). Ranks sharing one CPU or one GPU
compete for it, so the measured ratio is a floor, not what K devices give; the model is.
Writes results/bench/module-parallel-<arch>-<regime>-b<batch>-<device>.csv with provenance.
"""

import tempfile
from pathlib import Path

from infopro.bench import write_measurement
from infopro.cli import ArgumentParser, at_least, run
from infopro.config import TrainConfig
from infopro.data import DATASETS
from infopro.device import resolve_device
from infopro.local import OBJECTIVES
from infopro.models import ARCHS
from infopro.module_parallel_throughput import compare_throughput
from infopro.records import check_writable, device_slug, provenance


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.bench_module_parallel", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="resnet32", choices=ARCHS)
    p.add_argument("--regime", default="infopro", choices=list(OBJECTIVES))
    p.add_argument("--K", type=at_least(2), nargs="+", default=[2, 4], help="local modules, one rank each")
    p.add_argument("--staleness", type=at_least(0), nargs="+", default=[0, 2], help="max staleness values to time")
    p.add_argument("--dataset", default="synthetic", choices=DATASETS)
    p.add_argument("--data-root")
    p.add_argument("--train-subset", type=at_least(1), default=2048)
    p.add_argument("--test-subset", type=at_least(1), default=1000,
                   help="test images each epoch evaluates (not timed: only training epochs are)")
    p.add_argument("--batch-size", type=at_least(1), default=128)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--out", default="results/bench")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device = resolve_device(args.device)
    configs = [TrainConfig(arch=args.arch, regime=args.regime, K=K, dataset=args.dataset,
                           train_subset=args.train_subset, test_subset=args.test_subset, epochs=2,
                           batch_size=args.batch_size, warmup_epochs=1) for K in args.K]
    for config in configs:  # refuse a K without a split (or λs) before measuring the others
        config.resolved()
    check_writable(args.out)
    rows = []
    for config in configs:
        with tempfile.TemporaryDirectory() as folder:
            rows += compare_throughput(config, args.staleness, folder, device)
    context = {"arch": args.arch, "dataset": args.dataset, "train_images": args.train_subset,
               "batch_size": args.batch_size} | provenance(device)
    path = Path(args.out) / f"module-parallel-{args.arch}-{args.regime}-b{args.batch_size}-{device_slug(device)}.csv"
    write_measurement(path, rows, context)


if __name__ == "__main__":
    run(main)
