"""Local objectives and the network cut into K gradient-isolated modules.

Regimes (one objective per module end; the last module always uses the network's own head
and softmax cross-entropy):

* ``e2e``     K = 1: nothing local;
* ``greedy``  greedy supervised learning: global pool + one linear layer, cross-entropy
              (the paper code's "0c1f" head);
* ``dgl``     decoupled greedy learning (Belilovsky et al., 2020), the baseline of the paper's
              Table 2: cross-entropy through DGL's deeper "MLP-SR" auxiliary classifier;
* ``infopro`` λ1 · BCE(decoder(h), x) + λ2 · task term, the surrogate -λ1 I(h,x) - λ2 I(h,y):
              the decoder keeps information about the input x, the task term (supervised
              contrastive on a 128-d embedding, or softmax cross-entropy) about the label y;
              both through the paper's "1c2f" auxiliary head.

Objectives are loss modules (`objective(h, x, y) -> loss`), one per regime in `OBJECTIVES`; the
trainer decides where the graph is cut and when `backward` runs.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from infopro.errors import InfoProError
from infopro.models import CifarResNet, build_backbone, init_like_paper
from infopro.splits import LossWeights

TASK_LOSSES = ("contrast", "softmax")
CONTRAST_DIM = 128          # embedding size of the contrastive head (--aux_net_feature_dim)
HIDDEN_DIM = 128            # hidden width of the auxiliary head's two FC layers
DECODER_WIDTH = 12          # decoder hidden channels (--aux_net_widen 1)
TEMPERATURE = 0.07          # supervised-contrastive temperature (= base temperature)


def upcast(t: torch.Tensor) -> torch.Tensor:
    """`t` in at least fp32: losses and statistics are not computed in bf16 (float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class Decoder(nn.Module):
    """Bilinear up-sampling to the image size, conv3x3-BN-ReLU, conv3x3 to 3 channels.

    Returns logits; the sigmoid of the paper's decoder is folded into the loss
    (`binary_cross_entropy_with_logits`), which is the same function but numerically safer
    and allowed under bf16 autocast.
    """

    def __init__(self, in_channels: int, image_size: int = 32, width: int = DECODER_WIDTH):
        super().__init__()
        self.image_size = image_size
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, 3, 3, 1, 1))

    def forward(self, h):
        if h.shape[-1] != self.image_size:  # at full size bilinear up-sampling is the identity
            h = upsample(h, self.image_size)
        return self.body(h)


def upsample(h: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear (corner-aligned) up-sampling of h to size x size, returned in h's memory format.

    It runs channels-last: on the CPU PyTorch's channels-last kernel is several times faster
    than its NCHW one, forward and backward, and gives the same numbers bit for bit, so CPU
    runs trained with either replay exactly. On CUDA h is channels-last already.
    """
    channels_last = h.is_contiguous(memory_format=torch.channels_last)
    up = F.interpolate(h.contiguous(memory_format=torch.channels_last), size=(size, size),
                       mode="bilinear", align_corners=True)
    return up if channels_last else up.contiguous()


def reconstruction_loss(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of the decoder's pixels against the [0, 1] image x."""
    return F.binary_cross_entropy_with_logits(upcast(logits), x)


class AuxHead(nn.Module):
    """The paper's "1c2f" auxiliary head: conv3x3-BN-ReLU, global pool, FC-ReLU-FC.

    The convolution has min(2C, 64) channels and stride 2 on maps larger than 8x8, which
    gives the paper's 16->32 (s2), 32->64 (s2) and 64->64 (s1) and extends to any input.
    """

    def __init__(self, in_channels: int, size: int, out_features: int, hidden: int = HIDDEN_DIM):
        super().__init__()
        channels, stride = min(2 * in_channels, 64), 2 if size > 8 else 1
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False), nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(channels, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_features))

    def forward(self, h):
        return self.body(h)


def supervised_contrastive_loss(embedding: torch.Tensor, labels: torch.Tensor,
                                temperature: float = TEMPERATURE, gather_batch=None) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al., 2020), one view per sample.

    Each anchor's positives are the other samples of its class in the batch; the loss is
    the negative mean log-probability of its positives among all other samples, averaged
    over anchors. Anchors without a positive contribute 0 but still count in the average,
    as in the paper's code. Computed in fp32: at τ = 0.07 bf16 logits are too coarse.

    When this process holds one shard of the batch (data-parallel training), the anchors are
    its samples and the contrast set is the whole batch: `gather_batch(z, labels)` returns
    every rank's rows (differentiably) and the offset of this shard among them.
    """
    z = F.normalize(upcast(embedding), dim=1)
    (batch_z, batch_labels), offset = (z, labels), 0
    if gather_batch is not None:
        (batch_z, batch_labels), offset = gather_batch(z, labels)
    logits = z @ batch_z.T / temperature
    # Each anchor's own column, compared on the device: indexing with host tensors would sync CUDA.
    anchors = offset + torch.arange(len(labels), device=z.device)
    is_self = anchors[:, None] == torch.arange(len(batch_labels), device=z.device)[None, :]
    logits = logits - logits.detach().max(dim=1, keepdim=True).values
    log_prob = logits - torch.logsumexp(logits.masked_fill(is_self, float("-inf")), dim=1, keepdim=True)
    positives = (labels[:, None] == batch_labels[None, :]) & ~is_self
    count = positives.sum(1)
    mean_log_prob = (log_prob * positives).sum(1) / count.clamp(min=1)
    return -mean_log_prob.mean()


class GreedyObjective(nn.Module):
    """Greedy SL: softmax cross-entropy of a global-pool + linear classifier on h."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                        nn.Linear(in_channels, num_classes))

    def forward(self, h, x, y):
        return F.cross_entropy(self.classifier(h), y)


class DGLObjective(nn.Module):
    """DGL: softmax cross-entropy of DGL's "MLP-SR" auxiliary classifier on h (C channels, s x s).

    Average pooling to ceil(s/4) x ceil(s/4) (the spatial reduction, "SR"), three 1x1
    conv-BN-ReLU at C channels, average pooling to 2x2, then three Linear-BN-ReLU of width 4C
    and a linear layer to the classes: the "mlp-sr" auxiliary problem of DGL's own code
    (eugenium/DGL, auxiliary_nets_study). The InfoPro paper does not say which auxiliary net its
    DGL row used (docs/paper.md); this is DGL's, so the row tests DGL as its authors defined it.
    """

    def __init__(self, in_channels: int, size: int, num_classes: int):
        super().__init__()
        width = 4 * in_channels
        mixing = [layer for _ in range(3) for layer in (nn.Conv2d(in_channels, in_channels, 1, bias=False),
                                                         nn.BatchNorm2d(in_channels), nn.ReLU(inplace=True))]
        mlp = [layer for _ in range(3) for layer in
               (nn.Linear(width, width), nn.BatchNorm1d(width), nn.ReLU(inplace=True))]
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(math.ceil(size / 4)), *mixing,
                                        nn.AdaptiveAvgPool2d(2), nn.Flatten(), *mlp, nn.Linear(width, num_classes))

    def forward(self, h, x, y):
        return F.cross_entropy(upcast(self.classifier(h)), y)


class InfoProObjective(nn.Module):
    """λ1 · reconstruction BCE (keeps I(h,x)) + λ2 · task loss (keeps I(h,y)).

    A term whose weight is 0 is not computed (the paper's code runs it and multiplies by 0):
    the backbone's gradient is identical, and the step saves that head's time and memory.
    """

    gather_batch = None  # set by data-parallel training: the contrast set spans every rank's shard

    def __init__(self, in_channels: int, size: int, num_classes: int, task_loss: str,
                 lambda1: float, lambda2: float):
        super().__init__()
        self.task_loss, self.lambda1, self.lambda2 = task_loss, lambda1, lambda2
        self.decoder = Decoder(in_channels)
        out = CONTRAST_DIM if task_loss == "contrast" else num_classes
        self.aux_head = AuxHead(in_channels, size, out)

    def forward(self, h, x, y):
        loss = h.new_zeros((), dtype=torch.float32)
        if self.lambda1:
            loss = loss + self.lambda1 * reconstruction_loss(self.decoder(h), x)
        if self.lambda2:
            output = self.aux_head(h)
            task = supervised_contrastive_loss(output, y, gather_batch=self.gather_batch) \
                if self.task_loss == "contrast" else F.cross_entropy(upcast(output), y)
            loss = loss + self.lambda2 * task
        return loss

    def idle_parameters(self) -> list[nn.Parameter]:
        """Parameters of a term whose weight is 0: never computed, so never trained."""
        idle = [] if self.lambda1 else list(self.decoder.parameters())
        return idle + ([] if self.lambda2 else list(self.aux_head.parameters()))

    def extra_repr(self) -> str:
        return f"task_loss={self.task_loss}, lambda1={self.lambda1:g}, lambda2={self.lambda2:g}"


@dataclass(frozen=True)
class ModuleEnd:
    """What a local objective is built from: the shape of the features h at its module end (channels,
    height = width), the number of classes, and InfoPro's task loss and this module's λ1, λ2 (None
    for a regime without λ: its config resolves none)."""

    channels: int
    size: int
    num_classes: int
    task_loss: str
    lambda1: float | None
    lambda2: float | None


# Regime -> the objective that trains each of its modules but the last (E2E has none: K = 1). A new local
# loss is one entry here, in this file or at run time, and one of `style.METHODS` (docs/extending.md).
OBJECTIVES = {
    "greedy": lambda end: GreedyObjective(end.channels, end.num_classes),
    "dgl": lambda end: DGLObjective(end.channels, end.size, end.num_classes),
    "infopro": lambda end: InfoProObjective(end.channels, end.size, end.num_classes, end.task_loss,
                                            end.lambda1, end.lambda2),
}


def regimes() -> tuple[str, ...]:
    """E2E and every regime of `OBJECTIVES`, those registered at run time included."""
    return "e2e", *OBJECTIVES


def run_layers(layers, h: torch.Tensor) -> torch.Tensor:
    """Apply `layers` in order: how a module's backbone segment runs unless told otherwise."""
    for layer in layers:
        h = layer(h)
    return h


class LocalModule(nn.Module):
    """One local module on its own: its backbone layers, then its objective or, last, the head.

    forward(h, x, y) -> (output, local loss, head logits or None), where h is the module's
    input and x the augmented image in [0, 1] (for reconstruction). It owns exactly this
    module's parameters, which makes it the unit that data-parallel training wraps in DDP.
    `run_segment(layers, h)` may replace how the layers run (e.g. with checkpointing).
    """

    def __init__(self, layers: nn.ModuleList, top: nn.Module, last: bool):
        super().__init__()
        self.layers, self.top, self.last = layers, top, last

    def forward(self, h, x, y, run_segment=run_layers):
        h = run_segment(self.layers, h)
        if not self.last:
            return h, self.top(h, x, y), None
        logits = self.top(h)
        return h, F.cross_entropy(upcast(logits), y), logits


class LocalNet(nn.Module):
    """A backbone cut after layer points `ends` into K = len(ends) + 1 modules, with objectives.

    Module k runs `backbone.layers[bounds[k]:bounds[k+1]]`; `objectives[k]` trains modules
    k < K-1 and `backbone.head` with cross-entropy trains the last one. The state dict holds
    the backbone under `backbone.*`, so analysis code can load just the backbone.
    """

    def __init__(self, backbone: CifarResNet, ends: list[int], objectives: list[nn.Module]):
        super().__init__()
        assert len(objectives) == len(ends)
        self.backbone = backbone
        self.ends = list(ends)
        self.objectives = nn.ModuleList(objectives)
        # Views of the same submodules, one per local module (a plain list: not in the state dict).
        self.local_modules = [LocalModule(self.segment(k), self.objectives[k] if k < self.K - 1 else backbone.head,
                                          k == self.K - 1) for k in range(self.K)]

    @property
    def K(self) -> int:
        return len(self.ends) + 1

    @property
    def bounds(self) -> list[int]:
        """Layer slice boundaries [0, e1, ..., e_{K-1}, number of layer points]."""
        return [0, *self.ends, self.backbone.num_layer_points]

    def segment(self, k: int) -> nn.ModuleList:
        """The backbone layers of module k (0-based)."""
        return self.backbone.layers[self.bounds[k]:self.bounds[k + 1]]

    def module_of_parameter(self) -> dict[str, int]:
        """Parameter name -> index of the local module it belongs to (for gradient-isolation tests)."""
        owner = {}
        for k in range(self.K):
            for layer in range(self.bounds[k], self.bounds[k + 1]):
                for name, _ in self.backbone.layers[layer].named_parameters():
                    owner[f"backbone.layers.{layer}.{name}"] = k
        for name, _ in self.backbone.head.named_parameters():
            owner[f"backbone.head.{name}"] = self.K - 1
        for k, objective in enumerate(self.objectives):
            for name, _ in objective.named_parameters():
                owner[f"objectives.{k}.{name}"] = k
        return owner


def rows_per_batch(regime: str) -> int:
    """Samples a training batch must hold for the regime's batch normalisation: two under DGL, whose
    auxiliary MLP normalises feature vectors (BatchNorm1d), else one (BatchNorm2d has pixels too)."""
    return 2 if regime == "dgl" else 1


def check_e2e_is_one_module(regime: str, K: int) -> None:
    """Refuse E2E with K > 1: E2E back-propagates through the whole network, so it has no cut."""
    if regime == "e2e" and K != 1:
        raise InfoProError(f"regime e2e trains one module; got K={K} (use --K 1, or --regime greedy|infopro)")


def build_local_net(arch: str, regime: str, ends: list[int], weights: LossWeights,
                    task_loss: str = "contrast", num_classes: int = 10) -> LocalNet:
    """Backbone plus the regime's objective at each module end, initialised as the paper's code."""
    if regime not in regimes():
        raise InfoProError(f"unknown regime {regime!r}; valid: {', '.join(regimes())}")
    if task_loss not in TASK_LOSSES:
        raise InfoProError(f"unknown task loss {task_loss!r}; valid: {', '.join(TASK_LOSSES)}")
    check_e2e_is_one_module(regime, len(ends) + 1)
    backbone = build_backbone(arch, num_classes)
    objectives = []
    for k, end in enumerate(ends):
        channels, size, _ = backbone.layer_shape(end)
        lambdas = (weights.lambda1[k], weights.lambda2[k]) if weights.lambda1 else (None, None)
        objectives.append(OBJECTIVES[regime](ModuleEnd(channels, size, num_classes, task_loss, *lambdas)))
    init_like_paper(nn.ModuleList(objectives))
    return LocalNet(backbone, ends, objectives)
