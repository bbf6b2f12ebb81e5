"""Estimates of I(h,x) and I(h,y) for a feature h, as predictive ("usable") information in nats.

The paper estimates I(h,x) with a decoder trained to reconstruct x and I(h,y) with a
classifier trained to predict y, but never published the protocol. Ours, in the form of
predictive V-information (Xu et al., ICLR 2020) for a stated predictor family V:

    Î(h;t) = H_V(t) − H_V(t | h),

H_V(t | h) being the held-out cross-entropy of a predictor of t trained on h, and H_V(t)
that of the best predictor that ignores h. Both are measured on test data the predictor
never saw; the epoch is chosen on a validation slice of the training data.

* I(h,y): predictor = the paper's "1c2f" auxiliary head (conv3x3-BN-ReLU, global pool,
  FC-ReLU-FC) with softmax cross-entropy; H_V(y) = cross-entropy of the training label
  frequencies (ln 10 = 2.303 nats for balanced CIFAR-10). Reported in nats and divided by
  H_V(y). For a discrete label and a well-trained predictor this approaches the Shannon
  I(h;y) from below (Barber-Agakov bound).
* I(h,x): predictor = InfoPro's decoder (bilinear up-sampling, conv3x3-BN-ReLU, conv3x3)
  with per-pixel binary cross-entropy against x in [0, 1], i.e. each intensity read as the
  probability of a stochastically binarised pixel; H_V(x) = that cross-entropy for the
  best image a decoder can produce from an uninformative h (each channel's mean
  intensity). Reported in nats per image (sum over 3x32x32 values) and as the fraction
  of the reducible cross-entropy removed: (H_V(x) − BCE(h)) / (H_V(x) − BCE(x, x)),
  where BCE(x, x), the entropy of the intensities themselves, is what a perfect
  reconstruction would reach. For a deterministic network the Shannon I(h;x) is degenerate
  (infinite for continuous x); this is a measure of how much of x a small decoder can
  recover from h, not a bound on it.

Both estimators are validated on synthetic cases with known answers (tests/test_mi.py).
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from infopro.augment import to_unit
from infopro.errors import InfoProError
from infopro.local import AuxHead, Decoder
from infopro.models import init_like_paper


@dataclass(frozen=True)
class EstimatorSettings:
    """How each predictor is trained (Adam); recorded beside every estimate."""

    epochs: int = 20
    batch_size: int = 256
    lr: float = 3e-3
    val_fraction: float = 0.1
    seed: int = 0

    def __post_init__(self):
        """Refuse settings that train no predictor, or train it on nothing, before any run is loaded."""
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0 or not 0 < self.val_fraction < 1:
            raise InfoProError("the estimators need epochs >= 1, batch size >= 1, lr > 0 and a validation "
                               f"fraction in (0, 1); got {self}")

    def as_columns(self) -> dict:
        return {f"est_{key}": value for key, value in asdict(self).items()}


def split_validation(n: int, fraction: float, seed: int):
    """Fixed random split of n training indices into (fit, validation)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    cut = max(1, int(round(n * fraction)))
    return order[cut:], order[:cut]


def mean_loss(model: nn.Module, inputs, targets, loss_fn, batch_size: int) -> float:
    """Mean of `loss_fn` (a mean over the batch) over all samples, model in eval mode."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            batch = slice(start, start + batch_size)
            total += loss_fn(model(inputs[batch]), targets[batch]).item() * len(inputs[batch])
    return total / len(inputs)


def start_at_null_predictor(last: nn.Module, bias: torch.Tensor) -> None:
    """Zero the last layer's weights and set its bias: the model starts as the best predictor
    that ignores h, so the training below can only find something better on validation data,
    and an uninformative h gives Î close to 0 instead of a negative value from under-fitting."""
    nn.init.zeros_(last.weight)
    with torch.no_grad():
        last.bias.copy_(bias)


def fit_predictor(model: nn.Module, inputs, targets, loss_fn, settings: EstimatorSettings) -> nn.Module:
    """Train with Adam; keep the weights (initial ones included) with the lowest validation loss."""
    fit, val = split_validation(len(inputs), settings.val_fraction, settings.seed)
    fit, val = fit.to(inputs.device), val.to(inputs.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    generator = torch.Generator(device=inputs.device).manual_seed(settings.seed)
    best, best_state = math.inf, None
    for epoch in range(settings.epochs + 1):
        if epoch > 0:
            model.train()
            order = fit[torch.randperm(len(fit), generator=generator, device=inputs.device)]
            for index in order.split(settings.batch_size):
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(inputs[index]), targets[index]).backward()
                optimizer.step()
        loss = mean_loss(model, inputs[val], targets[val], loss_fn, settings.batch_size)
        if loss < best:
            best, best_state = loss, {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return model.eval()


def label_prior(train_y, num_classes: int) -> torch.Tensor:
    """Training label frequencies: the best prediction of y that ignores h."""
    return (torch.bincount(train_y, minlength=num_classes).float() / len(train_y)).clamp_min(1e-12)


def channel_means(train_x) -> torch.Tensor:
    """Mean training intensity per channel in (0, 1): the best decoder output that ignores h.

    A convolutional decoder fed a constant input produces a spatially uniform image, so it
    can do no better than each channel's mean.
    """
    return to_unit(train_x).mean(dim=(0, 2, 3)).clamp(1e-6, 1 - 1e-6)


def information_about_y(train_h, train_y, test_h, test_y, settings=EstimatorSettings(),
                        num_classes: int = 10) -> dict:
    """Î(h;y) in nats, and divided by H_V(y), from a trained 1c2f classifier on h."""
    torch.manual_seed(settings.seed)
    prior = label_prior(train_y, num_classes)
    classifier = AuxHead(train_h.shape[1], train_h.shape[-1], num_classes)
    init_like_paper(classifier)
    start_at_null_predictor(classifier.body[-1], prior.log())
    classifier = fit_predictor(classifier.to(train_h.device), train_h, train_y, F.cross_entropy, settings)
    cross_entropy = mean_loss(classifier, test_h, test_y, F.cross_entropy, settings.batch_size)
    entropy = -prior.log()[test_y].mean().item()
    return {"ixy_cross_entropy": cross_entropy, "hy": entropy, "ixy_nats": entropy - cross_entropy,
            "ixy_normalised": (entropy - cross_entropy) / entropy}


class _Reconstruction(nn.Module):
    """Pixel BCE of decoder logits against uint8 targets, averaged over pixels and batch."""

    def forward(self, logits, images):
        return F.binary_cross_entropy_with_logits(logits, to_unit(images))


def image_entropy_floor(test_x) -> float:
    """BCE(x, x): per-value cross-entropy a perfect reconstruction reaches (in nats)."""
    unit = to_unit(test_x)
    return F.binary_cross_entropy(unit, unit).item()


def null_input_baseline(train_x, test_x) -> float:
    """H_V(x): per-value test BCE of the channel means, the best output for an uninformative h."""
    target = to_unit(test_x)
    prediction = channel_means(train_x).view(1, -1, 1, 1).expand_as(target)
    return F.binary_cross_entropy(prediction, target).item()


def information_about_x(train_h, train_x, test_h, test_x, settings=EstimatorSettings()) -> dict:
    """Î(h;x) in nats per image, and as a fraction of the reducible reconstruction entropy.

    `train_x`, `test_x` are the uint8 images the features were computed from.
    """
    torch.manual_seed(settings.seed)
    decoder = Decoder(train_h.shape[1], image_size=train_x.shape[-1])
    init_like_paper(decoder)
    start_at_null_predictor(decoder.body[-1], torch.logit(channel_means(train_x)))
    decoder = fit_predictor(decoder.to(train_h.device), train_h, train_x, _Reconstruction(), settings)
    bce = mean_loss(decoder, test_h, test_x, _Reconstruction(), settings.batch_size)
    baseline, floor = null_input_baseline(train_x, test_x), image_entropy_floor(test_x)
    values_per_image = train_x[0].numel()
    return {"ixx_bce": bce, "ixx_baseline_bce": baseline, "ixx_floor_bce": floor,
            "ixx_nats": (baseline - bce) * values_per_image,
            "ixx_normalised": (baseline - bce) / (baseline - floor)}
