"""Linear probes: how linearly separable is the frozen feature at each layer point?

Protocol (the paper's is unpublished; this is ours, stated in the README):
the trained backbone is frozen in eval mode (BN uses running statistics) and checked to be
unchanged afterwards; features are taken at every layer point for the run's own train and
test images, without augmentation; by default each feature map is global-average pooled
(the greedy heads are global-pool + linear, so this measures the separability the local
losses optimise; `avgN` and `none` keep spatial detail); features are standardised with
train statistics, and a multinomial logistic regression with a small L2 penalty is fitted
to convergence on the whole train set by L-BFGS (convex, so no learning-rate or epoch
choices to tune); train and test error are reported.
"""

import re
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from infopro.augment import to_unit
from infopro.data import Split
from infopro.device import prepare_input
from infopro.errors import InfoProError
from infopro.models import CifarResNet

DEFAULT_L2 = 1e-4
DEFAULT_MAX_ITER = 500
EXTRACT_BATCH = 500


def check_pool(pool: str) -> str:
    if pool in ("gap", "none") or re.fullmatch(r"avg[1-9][0-9]*", pool):
        return pool
    raise InfoProError(f"unknown pooling {pool!r}; valid: gap, none, avgN (e.g. avg2)")


def check_l2(l2: float) -> float:
    """A negative (or NaN) penalty makes the probe's objective unbounded: its error would mean nothing."""
    if not l2 >= 0:
        raise InfoProError(f"the probe's L2 penalty must be >= 0, got {l2}")
    return l2


def pool_features(h: torch.Tensor, pool: str) -> torch.Tensor:
    """(B, C, H, W) -> (B, D): global average, adaptive average to N x N, or flattened."""
    if pool == "gap":
        return h.mean(dim=(2, 3))
    if pool == "none":
        return h.flatten(1)
    return F.adaptive_avg_pool2d(h, int(pool[3:])).flatten(1)


@contextmanager
def frozen(module: torch.nn.Module):
    """Eval mode for the enclosed code, then verify that no parameter or buffer changed.

    A probe must measure the trained network, not a network nudged by the probe: BN
    running statistics in particular change silently if a forward pass runs in train mode.
    """
    before = {name: value.detach().clone() for name, value in module.state_dict().items()}
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
    changed = [name for name, value in module.state_dict().items() if not torch.equal(value, before[name])]
    if changed:
        raise RuntimeError(f"the frozen network changed during analysis: {', '.join(changed[:5])}")


@torch.inference_mode()
def extract_features(backbone: CifarResNet, split: Split, points, transform) -> dict[int, torch.Tensor]:
    """`transform(h)` of the feature at each layer point for every image of `split`, in order.

    Images are the un-augmented test-time inputs; features stay on the split's device.
    """
    device = split.images.device
    chunks = {point: [] for point in points}
    for start in range(0, len(split), EXTRACT_BATCH):
        x = prepare_input(to_unit(split.images[start:start + EXTRACT_BATCH]), device)
        for point, h in backbone.forward_intermediates(x, points).items():
            chunks[point].append(transform(h.float().contiguous()))
    return {point: torch.cat(parts) for point, parts in chunks.items()}


def standardise(train: torch.Tensor, test: torch.Tensor):
    """Zero mean, unit variance per dimension, with train statistics (dead units stay 0)."""
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    return (train - mean) / std, (test - mean) / std


def fit_logistic_regression(x, y, num_classes: int = 10, l2: float = DEFAULT_L2,
                            max_iter: int = DEFAULT_MAX_ITER) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (D, classes), bias) minimising mean cross-entropy + l2/2 * ||weight||^2 by full-batch
    L-BFGS; the bias is not penalised. The same objective as scikit-learn's multinomial
    LogisticRegression with C = 1 / (n * l2), which a test checks it reaches."""
    with torch.enable_grad():
        weight = torch.zeros(x.shape[1], num_classes, device=x.device, requires_grad=True)
        bias = torch.zeros(num_classes, device=x.device, requires_grad=True)
        optimizer = torch.optim.LBFGS([weight, bias], lr=1, max_iter=max_iter, history_size=20,
                                      tolerance_grad=1e-7, tolerance_change=1e-10,
                                      line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            loss = F.cross_entropy(x @ weight + bias, y) + 0.5 * l2 * weight.square().sum()
            loss.backward()
            return loss
        optimizer.step(closure)
    return weight.detach(), bias.detach()


def fit_linear_probe(train_x, train_y, test_x, test_y, num_classes: int = 10, l2: float = DEFAULT_L2,
                     max_iter: int = DEFAULT_MAX_ITER) -> dict:
    """Multinomial logistic regression on standardised features; train and test error in %."""
    train_x, test_x = standardise(train_x.float(), test_x.float())
    weight, bias = fit_logistic_regression(train_x, train_y, num_classes, l2, max_iter)

    def error(x, y):
        return 100.0 * ((x @ weight + bias).argmax(1) != y).sum().item() / len(y)
    return {"train_error": error(train_x, train_y), "test_error": error(test_x, test_y),
            "feature_dim": train_x.shape[1]}


def probe_layers(backbone: CifarResNet, train: Split, test: Split, points, pool: str = "gap",
                 l2: float = DEFAULT_L2, max_iter: int = DEFAULT_MAX_ITER, log=None) -> list[dict]:
    """Fit one linear probe per layer point of a frozen backbone; one result dict per point.

    Pooled features of all points are extracted in one pass; un-pooled ones a point at a
    time, since 16x32x32 floats per image do not fit many times over.
    """
    check_pool(pool)
    groups = [list(points)] if pool == "gap" else [[point] for point in points]
    results = []
    with frozen(backbone):
        for group in groups:
            def transform(h):
                return pool_features(h, pool)
            train_features = extract_features(backbone, train, group, transform)
            test_features = extract_features(backbone, test, group, transform)
            for point in group:
                result = fit_linear_probe(train_features[point], train.labels, test_features[point],
                                          test.labels, l2=l2, max_iter=max_iter)
                results.append({"layer": point, **result})
                if log:
                    log(f"  layer {point:>2}: train {result['train_error']:5.2f}%  test {result['test_error']:5.2f}%")
    return results
