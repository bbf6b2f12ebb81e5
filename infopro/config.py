"""The training config and the paper's recipe around it: schedule, optimiser, per-epoch randomness.

A `TrainConfig` is everything that determines a run's result (its run id is made from it); how
the run executes (device, compiled steps, time budget) is not part of it, so a run resumed on
another machine or in another step mode is still the same run.
"""

import math
from dataclasses import dataclass, fields

import numpy as np
import torch

from infopro.data import DATASETS
from infopro.errors import InfoProError
from infopro.local import TASK_LOSSES, LocalNet, build_local_net, check_e2e_is_one_module, regimes
from infopro.models import ARCHS
from infopro.splits import LossWeights, loss_weights, module_ends

PRECISIONS = ("fp32", "bf16")
WARMUP_START_LR = 0.01


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a run's result; defaults are the paper's CIFAR-10 recipe.

    K: number of gradient-isolated local modules (1 = end-to-end).
    split: "paper" (equal depth), "balanced" (InfoPro*, equal memory) or layer points "4,8,12".
    lambda1, lambda2: (first, last) weights of the reconstruction term (I(h,x)) and of the task
        term (I(h,y)) across the K-1 local modules, interpolated linearly; None = paper's table.
    warmup_epochs: epochs of the linear blend from lr 0.01 into the cosine schedule (paper: 10).
    train_subset, test_subset: use the first N images of a fixed permutation (None = all).
    """

    arch: str = "resnet32"
    regime: str = "e2e"
    K: int = 1
    task_loss: str | None = "contrast"
    split: str = "paper"
    lambda1: tuple[float, float] | None = None
    lambda2: tuple[float, float] | None = None
    dataset: str = "cifar10"
    train_subset: int | None = None
    test_subset: int | None = None
    epochs: int = 160
    batch_size: int = 1024
    lr: float = 0.8
    warmup_epochs: int = 10
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    precision: str = "fp32"

    def __post_init__(self):
        for name, valid in (("arch", ARCHS), ("regime", regimes()), ("dataset", DATASETS),
                            ("precision", PRECISIONS)):
            if getattr(self, name) not in valid:
                raise InfoProError(f"unknown {name} {getattr(self, name)!r}; valid: {', '.join(valid)}")
        if self.regime == "infopro" and self.task_loss not in TASK_LOSSES:
            raise InfoProError(f"unknown task loss {self.task_loss!r}; valid: {', '.join(TASK_LOSSES)}")
        if self.regime != "infopro":  # these fields mean nothing outside InfoPro: keep them out of the identity
            for name in ("task_loss", "lambda1", "lambda2"):
                object.__setattr__(self, name, None)
        for name in ("lambda1", "lambda2"):
            if getattr(self, name) is not None:
                weights = tuple(float(v) for v in getattr(self, name))
                if not all(0 <= w < math.inf for w in weights):  # a negative weight ascends its loss
                    raise InfoProError(f"--{name} weights must be finite and 0 or more, got {weights}")
                object.__setattr__(self, name, weights)
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise InfoProError(f"--{name.replace('_', '-')} must be at least 1")
        if self.warmup_epochs < 0:
            raise InfoProError("--warmup-epochs must be 0 or more")
        if not 0 < self.lr < math.inf:
            raise InfoProError(f"--lr must be positive and finite, got {self.lr}")
        if self.seed < 0:  # torch's generators take no negative seed
            raise InfoProError(f"--seed must be 0 or more, got {self.seed}")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Build from a dict (e.g. a config.json), refusing keys this version does not know."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InfoProError(f"unknown config keys: {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**values)

    def module_ends(self) -> list[int]:
        check_e2e_is_one_module(self.regime, self.K)
        return module_ends(self.arch, self.K, self.split)

    def loss_weights(self) -> LossWeights:
        if self.regime != "infopro":
            return LossWeights((), ())
        return loss_weights(self.arch, self.K, self.split, self.lambda1, self.lambda2)

    def resolved(self) -> dict:
        """The module ends and per-module λ1, λ2 it trains with; refuses a K the split cannot give."""
        ends, weights = self.module_ends(), self.loss_weights()
        return {"module_ends": ends, "lambda1": list(weights.lambda1), "lambda2": list(weights.lambda2)}

    @property
    def method(self) -> str:
        """The method as result files name it (`method_name`)."""
        return method_name(self.regime, self.task_loss)

    def run_id(self) -> str:
        """Directory name from the content: dataset, arch, regime, K, split, recipe, seed.

        The recipe tag lists what differs from the paper's recipe (n = train images, e = epochs,
        b = batch size, bf16), so a short CPU run never shares a name with a paper-recipe run.
        """
        split = "" if self.split == "paper" or self.K == 1 else f"-{self.split.replace(',', '_')}"
        paper = TrainConfig()
        recipe = "".join(f"-{tag}{getattr(self, name)}" for tag, name in
                         (("n", "train_subset"), ("e", "epochs"), ("b", "batch_size"))
                         if getattr(self, name) != getattr(paper, name))
        recipe += "-bf16" if self.precision == "bf16" else ""
        return f"{self.dataset}-{self.arch}-{self.method}-K{self.K}{split}{recipe}-s{self.seed}"


def method_name(regime: str, task_loss) -> str:
    """The method as result files name it: e2e, greedy, dgl, infopro-contrast, infopro-softmax."""
    return f"infopro-{task_loss}" if regime == "infopro" else regime


def build_net(config: TrainConfig) -> LocalNet:
    """The local network of `config`, initialised from its seed."""
    torch.manual_seed(config.seed)
    return build_local_net(config.arch, config.regime, config.module_ends(), config.loss_weights(),
                           config.task_loss or "contrast")


def learning_rate(config: TrainConfig, epoch: int) -> float:
    """Learning rate of epoch `epoch` (1-based), set once per epoch as the paper's `--cos_lr`.

    Cosine decay lr0 * (1 + cos(pi * e / E)) / 2; during the first W warm-up epochs it is
    blended linearly with 0.01: weight (e-1)/W on the cosine value, (W+1-e)/W on 0.01.
    """
    cosine = 0.5 * config.lr * (1 + math.cos(math.pi * epoch / config.epochs))
    warmup = config.warmup_epochs
    if epoch > warmup:
        return cosine
    return cosine * (epoch - 1) / warmup + WARMUP_START_LR * (warmup + 1 - epoch) / warmup


def epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    """Data order and augmentation of one epoch, a function of (seed, epoch) only.

    Re-seeding per epoch instead of saving generator state is what makes a resumed run
    draw exactly the batches the uninterrupted run would have drawn.
    """
    state = int(np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator(device=device).manual_seed(state)


def sgd(parameters, config: TrainConfig) -> torch.optim.SGD:
    """The paper's optimizer: SGD, Nesterov momentum, weight decay on every parameter."""
    return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, nesterov=True,
                           weight_decay=config.weight_decay)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

