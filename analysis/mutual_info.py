"""Estimated I(h,x) and I(h,y) per layer point (fig10), from a decoder and a classifier on h.

    python -m analysis.mutual_info --runs results/runs
    python -m analysis.mutual_info --only greedy --train-subset 5000 --epochs 10

Writes one row per (run, layer point) to results/analysis/mutual_information.csv; the
estimators and their units are described in infopro/mi.py and the README. The paper's
finding for greedy SL (docs/paper.md): both quantities drop within the first modules and are
not regained; in E2E networks I(h,y) stays flat while I(h,x) falls slowly. Measured cost
on 2 CPU cores: about 15 s per layer point with --train-subset 2000 --test-subset 1000
--epochs 10 (4 min per ResNet-32 run); on a GPU not yet measured.
"""

from analysis.probe import common_arguments
from infopro.analysis import analyse_runs, mutual_info_run, mutual_info_settings
from infopro.cli import ArgumentParser, run
from infopro.device import resolve_device
from infopro.mi import EstimatorSettings
from infopro.runs import finished_runs


def main(argv=None):
    defaults = EstimatorSettings()
    p = ArgumentParser(prog="python -m analysis.mutual_info", description=__doc__.split("\n\n")[0])
    common_arguments(p)
    p.add_argument("--epochs", type=int, default=defaults.epochs, help="training epochs of each estimator")
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr, help="Adam learning rate of each estimator")
    p.add_argument("--out", default="results/analysis/mutual_information.csv")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    settings = EstimatorSettings(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr)
    runs = finished_runs(args.runs, args.only)
    analyse_runs(
        runs, args.out,
        lambda r, layers: mutual_info_run(r, layers, settings=settings, train_subset=args.train_subset,
                                          test_subset=args.test_subset, device=device, data_root=args.data_root),
        lambda r: mutual_info_settings(r, settings, args.train_subset, args.test_subset),
        args.layers, force=args.force)


if __name__ == "__main__":
    run(main)
