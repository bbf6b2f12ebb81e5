"""The benchmark's methods: every family of memory saving it measures, by name (`greedy:4`).

Methods:

* ``e2e``                    end-to-end training;
* ``checkpoint``             E2E with gradient checkpointing over ceil(sqrt(n)) segments of the
                             n layers (Chen et al., 2016; `torch.utils.checkpoint`, non-reentrant);
* ``offload``                E2E with every saved activation kept in (pinned) host memory
                             (`torch.autograd.graph.save_on_cpu`; vDNN-style);
* ``greedy:K``, ``infopro:K`` local learning with the paper's equal-depth splits;
* ``dgl:K``                  DGL's MLP-SR auxiliary classifiers (not in the default set);
* ``infopro-softmax:K``      InfoPro with the softmax cross-entropy task term instead of the
                             contrastive one (not in the default set: it saves no more memory);
* ``infopro-balanced:K``     InfoPro* (ResNet-110, K = 2, 3, 4: memory-balanced splits);
* ``infopro+checkpoint:K``   InfoPro with checkpointing inside each local module.
"""

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint_sequential

from infopro.config import TrainConfig
from infopro.errors import InfoProError
from infopro.local import run_layers
from infopro.splits import PAPER_LOSS_WEIGHTS, PAPER_SPLITS

WHOLE_NETWORK = ("e2e", "checkpoint", "offload")  # families that back-propagate end to end: no K
CLASSIFIER_HEADS = ("greedy", "dgl")  # local families trained through a classifier alone: no λ1, λ2
FAMILIES = WHOLE_NETWORK + CLASSIFIER_HEADS + ("infopro", "infopro-softmax", "infopro-balanced", "infopro+checkpoint")
LOCAL_KS = (2, 4, 8, 16)


@dataclass(frozen=True)
class Method:
    """A way of training one step: a family and, for local learning, K."""

    family: str
    K: int = 1

    @classmethod
    def parse(cls, text: str) -> "Method":
        family, _, k = text.partition(":")
        if family not in FAMILIES:
            raise InfoProError(f"unknown method {text!r}; valid: e2e, checkpoint, offload, greedy:K, dgl:K, "
                               f"infopro:K, infopro-softmax:K, infopro-balanced:K, infopro+checkpoint:K")
        local = family not in WHOLE_NETWORK
        if local != bool(k) or (k and not k.isdigit()):
            raise InfoProError(f"method {text!r}: {'give K as ' + family + ':K' if local else family + ' takes no K'}")
        return cls(family, int(k) if k else 1)

    @property
    def split(self) -> str:
        return "balanced" if self.family == "infopro-balanced" else "paper"

    def check(self, arch: str) -> None:
        """Refuse a K the benchmark cannot build for `arch`, before any worker is started.

        It builds the paper's split, and for InfoPro the paper's λ1, λ2; K = 1 is e2e, which
        would otherwise be measured again under another name.
        """
        if not self.local:
            return
        heads_only = self.family in CLASSIFIER_HEADS
        table = PAPER_SPLITS if heads_only else PAPER_LOSS_WEIGHTS
        valid = sorted(table.get((arch, self.split), {}))
        if self.K not in valid:
            raise InfoProError(f"method {self.label!r}: the paper gives {arch} no {self.split} split"
                               f"{'' if heads_only else ' with λ1, λ2'} at K={self.K}; "
                               f"valid K: {', '.join(map(str, valid)) or 'none'}")

    @property
    def local(self) -> bool:
        return self.family not in WHOLE_NETWORK

    @property
    def label(self) -> str:
        return f"{self.family}:{self.K}" if self.local else self.family

    def config(self, arch: str, batch_size: int, precision: str) -> TrainConfig:
        regime = self.family if self.family in CLASSIFIER_HEADS else "infopro" if self.local else "e2e"
        task_loss = "softmax" if self.family == "infopro-softmax" else "contrast"
        return TrainConfig(arch=arch, regime=regime, K=self.K, task_loss=task_loss, split=self.split,
                           dataset="synthetic", batch_size=batch_size, precision=precision)

    def run_segment(self):
        return checkpointed if "checkpoint" in self.family else run_layers

    def context(self, device: torch.device):
        """Saved-tensor offloading for `offload` (pinned host memory on CUDA)."""
        if self.family == "offload":
            return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
        return nullcontext()

    @property
    def manages_saved_tensors(self) -> bool:
        return self.family in ("checkpoint", "offload", "infopro+checkpoint")


def checkpointed(layers, h: torch.Tensor) -> torch.Tensor:
    """Run `layers` as ceil(sqrt(n)) checkpointed segments (the last is kept, as usual).

    Recomputation runs BN in train mode a second time, which updates its running
    statistics twice per step: harmless for timing and memory, noted for anyone training
    with it.
    """
    layers = list(layers)
    if len(layers) < 2:
        return run_layers(layers, h)
    segments = math.ceil(math.sqrt(len(layers)))
    return checkpoint_sequential(layers, segments, h, use_reentrant=False)


def default_methods(arch: str) -> list[str]:
    methods = list(WHOLE_NETWORK)
    methods += [f"{family}:{K}" for family in ("greedy", "infopro") for K in LOCAL_KS]
    methods += [f"infopro-balanced:{K}" for K in sorted(PAPER_SPLITS.get((arch, "balanced"), {}))]
    methods += [f"infopro+checkpoint:{K}" for K in (2, 4)]
    return methods
