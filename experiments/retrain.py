"""Train finished runs again from their config.json and check that each comes out the same, number for number.

    python -m experiments.retrain results/schedule-check/cifar10-jpeg-resnet32-greedy-K8-n10000-e36-b128-s1 \
        --data-root .data --restore-weights

Each replay trains in `--work`/<run id> (resumable: run the command again to continue one cut
by --time-budget or an interrupt) on the device type the run was recorded on; bit for bit only on
the processor it was recorded on (it says so when the processors differ, by name or, on a CPU, by
instruction set or generation). It must equal the recorded metrics.csv in every epoch and column
but the timings, and stops after the first epoch that does not; a finished replay must also equal
the recorded model.pt tensor by tensor where the run has one. With --restore-weights a run
without model.pt gets the replay's once they agree, with weights.json beside it naming the
replay's provenance: how the weights git leaves out are rebuilt for an analysis. Exit 0 when
every replay matches, 1 when one differs. Costs what training the run cost (a 36-epoch
ResNet-32 of the schedule check: 25 to 100 min on 2 CPU cores).
"""

import time

from infopro.cli import ArgumentParser, positive, run
from infopro.retrain import ReplayDiffers, report, retrain
from infopro.runs import load_run


def main(argv=None):
    p = ArgumentParser(prog="python -m experiments.retrain", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN", help="finished run directories")
    p.add_argument("--work", default="build/retrain", help="folder of the replays (default: build/retrain)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="replay on this device (default: the recorded one)")
    p.add_argument("--data-root", help="folder or archive of the runs' dataset")
    p.add_argument("--restore-weights", action="store_true",
                   help="give a run without model.pt the replay's weights once they agree")
    p.add_argument("--time-budget", type=positive, metavar="MIN",
                   help="stop after the last epoch expected to end within MIN minutes (resumable)")
    args = p.parse_args(argv)
    runs = [load_run(path) for path in args.runs]
    deadline = None if args.time_budget is None else time.monotonic() + 60 * args.time_budget
    differing = []
    for finished in runs:
        left = None if deadline is None else deadline - time.monotonic()
        differences = None if left is not None and left <= 0 else retrain(
            finished, args.work, device=args.device, data_root=args.data_root, restore=args.restore_weights,
            time_budget=left)
        if differences is None:
            print(f"{finished.run_id}: stopped within the time budget; run the command again to continue")
            return
        report(finished, differences)
        if differences:
            differing.append(finished.run_id)
    if differing:
        raise ReplayDiffers(f"{len(differing)} of {len(runs)} replays differ from their records: "
                            f"{', '.join(differing)}")


if __name__ == "__main__":
    run(main)
