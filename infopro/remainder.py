"""I(h,y) and I(h,x) in the paper's units: the remainder estimator.

The paper's analysis figure puts I(h,y) at the last layer at 1 − the network's test error,
and E2E's I(h,y) at the stem at a whole ResNet-32's accuracy. Only a classifier with the
capacity of the rest of the network reaches that from stem features, so for a layer point L
this estimator freezes layers 1..L of a trained network and trains, on h_L, a freshly
initialised copy of everything after L: the remaining residual blocks and the head, the
network's own architecture. I(h,y) in the paper's units is that classifier's test accuracy
(`ixy_paper`); its test cross-entropy gives nats, H(y) − CE. At the last point the remainder
is the head alone, a linear classifier on the pooled features.

I(h,x) in the paper's units is 1 − the per-value test BCE of InfoPro's own decoder trained on
the frozen h_L (`ixx_paper`; a perfect reconstruction of our CIFAR copy would reach about
0.45, the paper's stem value); the normalised fraction of `infopro.mi` comes beside it.

Point 0 is the raw image (h = x): the whole architecture trained from scratch with the same
budget, the ceiling every point is read against. Its accuracy decides whether the budget is
long enough: a short one makes the deep remainders of early points fall short for budget
reasons alone, and E2E's curve would then rise with depth, which no I(h,y) can do.

Every remainder and decoder of one network trains in one process, on the same augmented
batches: one frozen forward of the network feeds all of them. Each is initialised from
(seed, point) and the batches from (seed, epoch), so a point's estimate does not depend on
which other points share the pass. The optimiser is the paper's family: SGD with Nesterov
momentum, a linear warm-up into a cosine schedule, augmentation on the device.

A pass launches thousands of small kernels a step (sixteen remainders, forward and backward, at
batch 512), so on a GPU its pace may be set by the host issuing them rather than by the GPU
running them. The `graphed` step replays each point's forward and backward as CUDA graphs
(`cuda_graph`): the same kernels on the same numbers, issued once per step instead of one by one.
"""

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from infopro.augment import augmented_batch, shuffled_batches, to_unit
from infopro.config import PRECISIONS, epoch_generator, learning_rate
from infopro.data import Split
from infopro.device import autocast, place, prepare_input
from infopro.errors import InfoProError
from infopro.local import Decoder, reconstruction_loss
from infopro.mi import channel_means, image_entropy_floor, label_prior, null_input_baseline, start_at_null_predictor
from infopro.models import CifarResNet, init_like_paper
from infopro.probes import frozen
from infopro.step import EVAL_BATCH


@dataclass(frozen=True)
class RemainderSettings:
    """The training budget of every remainder and decoder; recorded beside each estimate.

    A shorter schedule than the paper's 160 epochs, so weight decay is the usual 5e-4 of short
    CIFAR schedules rather than the paper's 1e-4; whether the budget suffices is measured, not
    assumed (`ceiling_within`).
    """

    epochs: int = 30
    batch_size: int = 512
    lr: float = 0.4
    warmup_epochs: int = 2
    momentum: float = 0.9
    weight_decay: float = 5e-4
    precision: str = "bf16"
    seed: int = 0

    def __post_init__(self):
        if self.epochs < 1 or self.batch_size < 2 or not 0 < self.lr < math.inf or self.warmup_epochs < 0:
            raise InfoProError("the remainder estimator needs epochs >= 1, batch size >= 2, a finite lr > 0 and "
                               f"warm-up epochs >= 0; got {self}")
        if self.precision not in PRECISIONS:
            raise InfoProError(f"unknown precision {self.precision!r}; valid: {', '.join(PRECISIONS)}")

    def as_columns(self) -> dict:
        return {f"rem_{key}": value for key, value in asdict(self).items()}


def depth_of(backbone: CifarResNet) -> int:
    """The network's depth 6n+2 from its 3n+1 layer points."""
    return 2 * backbone.num_layer_points


def remainder(depth: int, point: int, seed: int, num_classes: int = 10) -> nn.Sequential:
    """A fresh copy of the layers after `point` and the head of a ResNet-`depth` (point 0: all of it),
    initialised as the paper initialises a network, from (seed, point) alone."""
    torch.manual_seed(seed * 1000 + point)
    network = CifarResNet(depth, num_classes)
    return nn.Sequential(*network.layers[point:], network.head)


def decoder(backbone: CifarResNet, point: int, seed: int, mean_logits: torch.Tensor) -> Decoder:
    """InfoPro's decoder for the feature at `point`, initialised from (seed, point) alone, starting as the
    best decoder that ignores h (`infopro.mi.start_at_null_predictor`): a short budget then cannot put
    I(h,x) below what the channel means alone reconstruct."""
    torch.manual_seed(seed * 1000 + 500 + point)
    module = Decoder(backbone.layer_shape(point)[0])
    init_like_paper(module)
    start_at_null_predictor(module.body[-1], mean_logits)
    return module


class PointLoss(nn.Module):
    """One layer point's training loss: its remainder's cross-entropy on h and, past the input, its
    decoder's pixel BCE against the image."""

    def __init__(self, classifier: nn.Module, decoder: Decoder | None):
        super().__init__()
        self.classifier, self.decoder = classifier, decoder

    def forward(self, h: torch.Tensor, unit: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(self.classifier(h).float(), y)
        return loss if self.decoder is None else loss + reconstruction_loss(self.decoder(h), unit)


class Estimators(nn.Module):
    """A remainder classifier per layer point and, for points after the input, a decoder."""

    def __init__(self, backbone: CifarResNet, points: list[int], seed: int, train_images: torch.Tensor):
        super().__init__()
        self.points = list(points)
        depth, mean_logits = depth_of(backbone), torch.logit(channel_means(train_images)).cpu()
        self.classifiers = nn.ModuleDict({str(p): remainder(depth, p, seed) for p in points})
        self.decoders = nn.ModuleDict({str(p): decoder(backbone, p, seed, mean_logits) for p in points if p > 0})
        self.epoch_losses: list[float] = []  # per epoch: the mean over batches of the sum over points

    def point_loss(self, point: int) -> PointLoss:
        """A new `PointLoss` over the point's modules (a graph captured from one leaves the others eager)."""
        return PointLoss(self.classifiers[str(point)], self.decoders[str(point)] if point > 0 else None)


def check_points(backbone: CifarResNet, points) -> list[int]:
    points = sorted(set(points))
    if not points or points[0] < 0 or points[-1] > backbone.num_layer_points:
        raise InfoProError(f"remainder points must lie in 0..{backbone.num_layer_points} (0: the image itself), "
                           f"got {points}")
    return points


def frozen_features(backbone: CifarResNet, unit: torch.Tensor, points: list[int]) -> dict[int, torch.Tensor]:
    """h at each point for images in [0, 1] (point 0: the network's input), without a graph."""
    x = prepare_input(unit, unit.device)
    with torch.no_grad():
        deep = [p for p in points if p > 0]
        features = backbone.forward_intermediates(x, deep) if deep else {}
    return features | ({0: x} if 0 in points else {})


STEPS = ("eager", "graphed")  # how a pass's steps run: `train_estimators`


def cuda_graph(precision: str):
    """The graphed step's capture: a module's forward and backward as CUDA graphs, under the pass's
    autocast without its weight-cast cache (which a replay could not refresh)."""
    def capture(module: nn.Module, sample: tuple) -> nn.Module:
        with autocast(sample[0].device, precision, cache=False):
            return torch.cuda.make_graphed_callables(module, sample)
    return capture


def captured(module: nn.Module, sample: tuple, graph) -> nn.Module:
    """`graph(module, sample)` with the module's state put back afterwards: a capture first runs
    warm-up iterations on the sample, which move BatchNorm's running statistics (the state is copied
    back in place, where the graphs read it)."""
    state = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    step = graph(module, sample)
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            tensor.copy_(state[name])
    return step


def train_estimators(backbone: CifarResNet, train: Split, points: list[int], settings: RemainderSettings,
                     log=print, graph=None) -> Estimators:
    """Train every point's remainder (cross-entropy) and decoder (pixel BCE) on the frozen network's
    features of augmented training images; the network must be in eval mode (see `estimate`).

    With `graph` (`cuda_graph`, or a stand-in in tests), each point's loss is captured on the first
    whole batch and replayed on every whole batch after it; the last, smaller batch of an epoch
    runs eagerly, since a graph holds one shape."""
    device = train.images.device
    estimators = place(Estimators(backbone, points, settings.seed, train.images), device)
    optimizer = torch.optim.SGD(estimators.parameters(), lr=settings.lr, momentum=settings.momentum,
                                nesterov=True, weight_decay=settings.weight_decay)
    estimators.train()
    eager = {point: estimators.point_loss(point) for point in points}
    whole_batch_steps = None if graph else eager
    for epoch in range(1, settings.epochs + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(settings, epoch)
        generator = epoch_generator(settings.seed, epoch, device)
        loss_sum = torch.zeros((), device=device)
        batches = shuffled_batches(len(train), settings.batch_size, generator)
        for index in batches:
            unit, y = augmented_batch(train.images[index], generator), train.labels[index]
            with autocast(device, settings.precision):
                features = frozen_features(backbone, unit, points)
            whole = len(index) == settings.batch_size
            if whole and whole_batch_steps is None:
                whole_batch_steps = {point: captured(estimators.point_loss(point), (features[point], unit, y), graph)
                                     for point in points}
            steps = whole_batch_steps if whole else eager
            optimizer.zero_grad(set_to_none=True)
            for point in points:  # one backward per point frees its graph before the next is built
                # No cast cache: each weight is cast once per step anyway, and a captured graph cannot keep one.
                with autocast(device, settings.precision, cache=False):
                    loss = steps[point](features[point], unit, y)
                loss.backward()
                loss_sum += loss.detach()
            optimizer.step()
        estimators.epoch_losses.append(loss_sum.item() / len(batches))
        log(f"    epoch {epoch}/{settings.epochs}: loss {estimators.epoch_losses[-1]:.3f} "
            f"(mean over batches of the sum over points)")
    return estimators.eval()


@torch.no_grad()
def test_scores(backbone: CifarResNet, estimators: Estimators, test: Split, precision: str) -> dict[int, dict]:
    """Per point: test accuracy, mean cross-entropy and mean per-value decoder BCE, un-augmented."""
    sums = {p: torch.zeros(3, dtype=torch.float64, device=test.images.device) for p in estimators.points}
    for start in range(0, len(test), EVAL_BATCH):
        unit, y = to_unit(test.images[start:start + EVAL_BATCH]), test.labels[start:start + EVAL_BATCH]
        with autocast(unit.device, precision):
            features = frozen_features(backbone, unit, estimators.points)
            for point, h in features.items():
                logits = estimators.classifiers[str(point)](h).float()
                bce = (reconstruction_loss(estimators.decoders[str(point)](h), unit) * len(y) if point > 0
                       else torch.zeros((), device=unit.device))
                sums[point] += torch.stack([(logits.argmax(1) == y).sum().double(),
                                            F.cross_entropy(logits, y, reduction="sum").double(), bce.double()])
    return {point: dict(zip(("accuracy", "cross_entropy", "bce"), (total / len(test)).tolist()))
            for point, total in sums.items()}


def in_paper_units(point: int, scores: dict, hy: float, baseline: float, floor: float,
                   values_per_image: int) -> dict:
    """One point's scores as I(h,y) (accuracy; nats) and, past the input, I(h,x) (1 − BCE; nats; fraction)."""
    ixy_nats = hy - scores["cross_entropy"]
    row = {"layer": point, "ixy_paper": scores["accuracy"], "ixy_cross_entropy": scores["cross_entropy"], "hy": hy,
           "ixy_nats": ixy_nats, "ixy_normalised": ixy_nats / hy}
    if point > 0:
        bce = scores["bce"]
        row |= {"ixx_paper": 1 - bce, "ixx_bce": bce, "ixx_baseline_bce": baseline, "ixx_floor_bce": floor,
                "ixx_nats": (baseline - bce) * values_per_image,
                "ixx_normalised": (baseline - bce) / (baseline - floor)}
    return row


def step_graph(step: str, device: torch.device, precision: str):
    """The `graph` argument of `train_estimators` for `step` (one of STEPS)."""
    if step not in STEPS:
        raise InfoProError(f"unknown remainder step {step!r}; valid: {', '.join(STEPS)}")
    if step == "graphed" and device.type != "cuda":
        raise InfoProError(f"the graphed remainder step replays CUDA graphs; this pass runs on {device.type}")
    return cuda_graph(precision) if step == "graphed" else None


def estimate(backbone: CifarResNet, train: Split, test: Split, points, settings=RemainderSettings(),
             log=print, step: str = "eager") -> list[dict]:
    """One row per layer point (0: the image, the ceiling): the remainder's I(h,y) and the decoder's
    I(h,x), in the paper's units and in nats. The network is frozen in eval mode and checked to be
    unchanged afterwards. Each row also says how many points shared the pass, how long it took and
    how its steps ran (`pass_points`, `pass_seconds`, `pass_step`): what a network costs on the
    device, which plans the next ones. The step is not a setting of the estimate: both run the same
    kernels on the same numbers."""
    points = check_points(backbone, points)
    graph = step_graph(step, train.images.device, settings.precision)
    began = time.perf_counter()
    with frozen(backbone):
        estimators = train_estimators(backbone, train, points, settings, log, graph)
        scores = test_scores(backbone, estimators, test, settings.precision)  # its .tolist() waits for the device
    cost = {"pass_points": len(points), "pass_seconds": time.perf_counter() - began, "pass_step": step}
    hy = -label_prior(train.labels, 10).log()[test.labels].mean().item()
    baseline, floor = null_input_baseline(train.images, test.images), image_entropy_floor(test.images)
    return [in_paper_units(point, scores[point], hy, baseline, floor, test.images[0].numel()) | cost
            for point in points]


def ceiling_within(ceiling_accuracy: float, network_accuracy: float, points: float = 2.0) -> bool:
    """Whether the ceiling (point 0) comes within `points` percentage points of the trained network's own
    test accuracy: the budget test a remainder estimate must pass before its curve is read."""
    return 100 * (network_accuracy - ceiling_accuracy) <= points
