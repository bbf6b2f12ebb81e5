"""Train one CIFAR ResNet end-to-end, with greedy SL or with InfoPro, split into K local modules.

    python -m experiments.train --arch resnet32 --regime infopro --K 4 --task-loss contrast \
        --dataset cifar10 --out results/runs/cifar10-resnet32-infopro-contrast-K4-s0

Feeds Table 2 (test error vs K) and, through the saved model, fig8/fig10. Defaults are the
paper's recipe (160 epochs, batch 1024, lr 0.8, SGD Nesterov, cosine with 10 warm-up epochs);
the paper reports for ResNet-32 on CIFAR-10: E2E 7.37%, greedy SL K=4 16.07%, InfoPro
(contrast) K=4 8.58% (mean of 5 seeds). A smoke run on CPU:

    python -m experiments.train --regime infopro --K 4 --dataset synthetic --epochs 2 --out /tmp/run

Under torchrun with R > 1 processes it trains data-parallel (infopro/data_parallel.py): the
global batch of --batch-size images is split over the R ranks, with the result and the run
directory of one process:

    torchrun --nproc_per_node 4 -m experiments.train --regime infopro --K 4 --dataset cifar10 --out ...
"""

from infopro.cli import run
from infopro.train_cli import main

if __name__ == "__main__":
    run(main)
