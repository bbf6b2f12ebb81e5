"""The command line of one training run: options, the config they describe, one process or data-parallel ranks.

`python -m experiments.train` is this module's `main`; the grid starts each of its trainings as
`python -m infopro.train_cli`, the same main, so that the library never starts a caller's entry
point. `experiments.train_pipeline` shares the options.
"""

import os
from functools import partial

from infopro.cli import ArgumentParser, positive, run
from infopro.config import PRECISIONS, TrainConfig
from infopro.data import DATASETS
from infopro.data_parallel import DataParallel
from infopro.device import resolve_device
from infopro.distributed import Rank, run_as_torchrun_rank, under_torchrun
from infopro.errors import InfoProError
from infopro.local import TASK_LOSSES, regimes
from infopro.models import ARCHS
from infopro.step import STEP_MODES
from infopro.train import train

DESCRIPTION = "Train one CIFAR ResNet end-to-end, with greedy SL or with InfoPro, split into K local modules."


def pair(text: str) -> tuple[float, float]:
    """'FIRST,LAST' (or one value for both) -> (first, last)."""
    values = [float(v) for v in text.split(",")]
    if len(values) not in (1, 2):
        raise ValueError(text)
    return values[0], values[-1]


def add_training_arguments(p: ArgumentParser) -> None:
    """The options of one training run (shared with experiments.train_pipeline)."""
    defaults = TrainConfig()
    p.add_argument("--arch", default=defaults.arch, choices=ARCHS)
    p.add_argument("--regime", required=True, choices=regimes())
    p.add_argument("--K", type=int, default=1, help="number of local modules (1 = end-to-end)")
    p.add_argument("--task-loss", choices=TASK_LOSSES,
                   help="InfoPro's I(h,y) term: supervised contrastive or softmax cross-entropy "
                        f"(default: {TrainConfig.task_loss})")
    p.add_argument("--split", help="'paper' (equal depth), 'balanced' (InfoPro*, resnet110 K=2-4) or layer "
                                   f"points '4,8,12' (default: {TrainConfig.split})")
    p.add_argument("--lambda1", type=pair, metavar="FIRST,LAST",
                   help="reconstruction weight λ1 of the first and of the last local module; one value sets both "
                        "(default: paper)")
    p.add_argument("--lambda2", type=pair, metavar="FIRST,LAST",
                   help="task-term weight λ2 of the first and of the last local module; one value sets both "
                        "(default: paper)")
    p.add_argument("--dataset", required=True, choices=DATASETS)
    p.add_argument("--data-root", help="folder or archive of the dataset (default: data/ or .data/)")
    p.add_argument("--download", action="store_true", help="fetch the original CIFAR-10 if missing")
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--warmup-epochs", type=int, default=defaults.warmup_epochs)
    p.add_argument("--train-subset", type=int, metavar="N", help="train on N images of a fixed permutation")
    p.add_argument("--test-subset", type=int, metavar="N", help="test on N images of a fixed permutation")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--precision", default=defaults.precision, choices=PRECISIONS)
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue the run in --out after its last epoch")
    p.add_argument("--time-budget", type=positive, metavar="MIN",
                   help="stop after the last epoch expected to end within MIN minutes (resumable)")


def config_from(args) -> TrainConfig:
    """The config the options describe; options that would not change what is trained are refused.

    The config drops InfoPro's options outside InfoPro, so `--regime greedy --task-loss softmax`
    would silently train plain greedy SL under a command line that says otherwise; and one
    module is end-to-end training whatever the regime, so `--regime greedy --K 1` would train
    E2E under another run name.
    """
    given = [f"--{name.replace('_', '-')}" for name in ("task_loss", "lambda1", "lambda2")
             if getattr(args, name) is not None]
    if given and args.regime != "infopro":
        raise InfoProError(f"{', '.join(given)}: InfoPro's options, meaningless for --regime {args.regime}")
    if args.K == 1 and args.regime != "e2e":
        raise InfoProError(f"--regime {args.regime} with --K 1 is end-to-end training: "
                           f"use --regime e2e, or --K 2 or more")
    if args.K == 1 and args.split is not None:
        raise InfoProError("--split: one module (end-to-end) has no module ends to place")
    config = TrainConfig(
        arch=args.arch, regime=args.regime, K=args.K, task_loss=args.task_loss or TrainConfig.task_loss,
        split=args.split or TrainConfig.split, lambda1=args.lambda1, lambda2=args.lambda2, dataset=args.dataset,
        train_subset=args.train_subset, test_subset=args.test_subset, epochs=args.epochs,
        batch_size=args.batch_size, lr=args.lr, warmup_epochs=args.warmup_epochs, seed=args.seed,
        precision=args.precision)
    config.resolved()  # a K its split cannot give is refused before the data is loaded
    return config


def run_options(args) -> dict:
    """Keyword arguments of `train` (and of the other trainers) that are not part of the config."""
    return {"data_root": args.data_root, "download": args.download, "resume": args.resume,
            "time_budget": None if args.time_budget is None else 60 * args.time_budget}


def report(summary: dict | None, out) -> None:
    if summary is not None:
        print(f"final test error {summary['final_test_error']:.2f}% after {summary['epochs']} epochs -> {out}")


def replica_job(me: Rank, config: TrainConfig, out, options: dict) -> None:
    """One data-parallel rank's run; rank 0 reports."""
    summary = train(config, out, replicas=DataParallel(me), **options)
    if me.first:
        report(summary, out)


def main(argv=None):
    p = ArgumentParser(prog="python -m experiments.train", description=DESCRIPTION)
    add_training_arguments(p)
    p.add_argument("--step", default="auto", choices=STEP_MODES,
                   help="run each local module's step eagerly or under torch.compile, in the same fp32 or bf16 "
                        "math (default: auto, the mode this GPU model's committed epoch benchmark found faster, "
                        "else eager)")
    args = p.parse_args(argv)
    config = config_from(args)
    options = run_options(args)
    if under_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        if args.step == "compiled":
            raise InfoProError("--step compiled trains in one process; data-parallel ranks step eagerly")
        run_as_torchrun_rank(partial(replica_job, config=config, out=args.out, options=options),
                             resolve_device(args.device))
    else:
        report(train(config, args.out, device=args.device, step_mode=args.step, **options), args.out)


if __name__ == "__main__":
    run(main)
