"""Score every finished run's network on its whole test split, image by image (for table_paired).

    python -m analysis.score_test_images --runs results --data-root .data   # all runs with weights
    python -m analysis.score_test_images --only K2-n10000-e36                 # some of them

Writes one row per run to results/analysis/test_predictions.csv: the error on the images its
recorded error was measured on (which must reproduce it), the error on the test images it
never used (8,000 for a run on a 2,000-image test subset), and right/wrong per image, from
which `make table_paired` compares InfoPro with greedy SL image by image (infopro/paired.py).
A run without model.pt that was scored on its whole test split (the other seeds of the GPU
grid) enters with the right/wrong per image its training recorded in summary.json.
Measured cost on 2 CPU cores: about 30 s per ResNet-32 on 10,000 test images.
"""

from infopro.cli import ArgumentParser, run
from infopro.device import resolve_device
from infopro.paired import predict_runs
from infopro.runs import finished_runs


def main(argv=None):
    p = ArgumentParser(prog="python -m analysis.score_test_images", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="results", help="folder searched for finished runs")
    p.add_argument("--only", nargs="+", metavar="TEXT", help="score only runs whose id contains TEXT")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--data-root", help="folder or archive of the runs' dataset")
    p.add_argument("--force", action="store_true", help="redo runs already in the CSV")
    p.add_argument("--out", default="results/analysis/test_predictions.csv")
    args = p.parse_args(argv)
    predict_runs(finished_runs(args.runs, args.only), args.out, resolve_device(args.device),
                 args.data_root, force=args.force)


if __name__ == "__main__":
    run(main)
