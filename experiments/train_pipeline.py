"""Train with one process per local module, modules overlapping in time (Asy-InfoPro).

    torchrun --nproc_per_node 4 -m experiments.train_pipeline --regime infopro --K 4 \
        --dataset cifar10 --max-staleness 2 --out results/runs/cifar10-resnet32-infopro-contrast-K4-s0
    python -m experiments.train_pipeline --regime greedy --K 2 --dataset synthetic --epochs 2 --out /tmp/p

Same options and run directory as experiments.train, plus --max-staleness. Without torchrun
it spawns the K ranks itself. On CPU the ranks talk over gloo; on GPUs over NCCL when each
rank has its own GPU, else over gloo through host memory (several ranks may share a GPU).
The weights are those of experiments.train for the same config (infopro/module_parallel.py
says why), so its runs feed Table 2 and the analysis like any other. The paper reports
Asy-InfoPro on ResNet-110 at K = 2 / 4: 7.34 / 8.39% test error (docs/paper.md).
"""

from functools import partial

from infopro.cli import ArgumentParser, at_least, run
from infopro.device import resolve_device
from infopro.distributed import Rank, run_as_torchrun_rank, spawn_ranks, under_torchrun
from infopro.module_parallel import train_rank
from infopro.train_cli import add_training_arguments, config_from, report, run_options


def rank_job(me: Rank, config, out, options: dict) -> None:
    summary = train_rank(config, out, me, **options)
    if me.first:
        report(summary, out)


def main(argv=None):
    p = ArgumentParser(prog="python -m experiments.train_pipeline", description=__doc__.split("\n\n")[0])
    add_training_arguments(p)
    p.add_argument("--max-staleness", type=at_least(0), default=0, metavar="S",
                   help="batches a rank may run ahead of the next one (0 = none)")
    args = p.parse_args(argv)
    config = config_from(args)
    options = {"max_staleness": args.max_staleness} | run_options(args)
    job = partial(rank_job, config=config, out=args.out, options=options)
    device = resolve_device(args.device)
    if under_torchrun():
        run_as_torchrun_rank(job, device)
    else:
        spawn_ranks(job, config.K, device)


if __name__ == "__main__":
    run(main)
