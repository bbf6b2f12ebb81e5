"""Linear separability per layer point (fig8): a linear classifier on each frozen layer's features.

    python -m analysis.probe --runs results/runs            # all finished runs not yet probed
    python -m analysis.probe --only greedy-K4 --pool avg2    # some runs, another pooling

Writes one row per (run, layer point) to results/analysis/linear_probe.csv (see
infopro/probes.py for the protocol). The paper's read-off values for greedy SL ResNet-32
(docs/paper.md): at the last layer the probe error is close to the network's test error; early
layers of greedy SL with large K are far more separable than E2E's. Measured cost on 2 CPU
cores: 25 s per ResNet-32 run on 12,000 images (the fixture), about 1.5 min per run of the
paper's recipe (50,000 training images); on a GPU not yet measured.
"""


from infopro.analysis import KEY_POINTS, analyse_runs, probe_run, probe_settings
from infopro.cli import ArgumentParser, at_least, run
from infopro.device import resolve_device
from infopro.probes import DEFAULT_L2, check_l2, check_pool
from infopro.runs import finished_runs


def layer_list(text: str) -> list[int] | str:
    """--layers: comma-separated layer points, or "key" (each run's layer 1, module ends and last layer)."""
    return KEY_POINTS if text == KEY_POINTS else [int(item) for item in text.split(",")]


LAYERS_HELP = "layer points L1,L2,... or 'key': layer 1, each run's module ends and its last (default: all)"


def common_arguments(p: ArgumentParser):
    """Options shared by the per-layer analyses (probes and mutual information)."""
    p.add_argument("--runs", default="results/runs", help="folder searched for finished runs")
    p.add_argument("--only", nargs="+", metavar="TEXT", help="analyse only runs whose id contains TEXT")
    p.add_argument("--layers", type=layer_list, metavar="L1,L2", help=LAYERS_HELP)
    p.add_argument("--train-subset", type=at_least(1), metavar="N", help="use N of each run's training images")
    p.add_argument("--test-subset", type=at_least(1), metavar="N", help="use N of each run's test images")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-root", help="folder or archive of the runs' dataset")
    p.add_argument("--force", action="store_true", help="redo runs already in the CSV")


def main(argv=None):
    p = ArgumentParser(prog="python -m analysis.probe", description=__doc__.split("\n\n")[0])
    common_arguments(p)
    p.add_argument("--pool", default="gap", help="gap (default), avgN (e.g. avg2) or none")
    p.add_argument("--l2", type=float, default=DEFAULT_L2, help="L2 penalty of the logistic regression")
    p.add_argument("--out", default="results/analysis/linear_probe.csv")
    args = p.parse_args(argv)
    check_pool(args.pool)  # before any run is read: one without weights is skipped before its settings are
    check_l2(args.l2)
    device = resolve_device(args.device)
    runs = finished_runs(args.runs, args.only)
    analyse_runs(
        runs, args.out,
        lambda r, layers: probe_run(r, layers, pool=args.pool, l2=args.l2, train_subset=args.train_subset,
                                    test_subset=args.test_subset, device=device, data_root=args.data_root),
        lambda r: probe_settings(r, args.pool, args.l2, args.train_subset, args.test_subset),
        args.layers, force=args.force)


if __name__ == "__main__":
    run(main)
