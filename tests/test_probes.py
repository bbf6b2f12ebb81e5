"""Linear probes: known separability, a frozen backbone, and the analysis over a run."""

import pytest
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression

from infopro.models import build_backbone
from infopro.probes import fit_linear_probe, fit_logistic_regression, frozen, pool_features, probe_layers, standardise
from infopro.data import synthetic_splits


def labelled_features(n, eps, seed, dim=20):
    """Features = one-hot of a label that is wrong with probability eps (+ small noise).

    The best classifier predicts the observed label, so its error is eps: a known answer.
    """
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 10
    flip = torch.rand(n, generator=generator) < eps
    observed = torch.where(flip, (y + torch.randint(1, 10, (n,), generator=generator)) % 10, y)
    features = F.one_hot(observed, dim).float() + 0.1 * torch.randn(n, dim, generator=generator)
    return features, y


@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_probe_error_equals_the_known_error_rate(eps):
    train_x, train_y = labelled_features(3000, eps, 0)
    test_x, test_y = labelled_features(2000, eps, 1)
    result = fit_linear_probe(train_x, train_y, test_x, test_y)
    assert result["test_error"] == pytest.approx(100 * eps, abs=2.5)


def test_probe_on_label_free_features_is_at_chance():
    generator = torch.Generator().manual_seed(0)
    result = fit_linear_probe(torch.randn(2000, 16, generator=generator), torch.arange(2000) % 10,
                              torch.randn(2000, 16, generator=generator), torch.arange(2000) % 10)
    assert 85 < result["test_error"] < 95


@pytest.mark.parametrize("l2", [1e-4, 1e-2])
def test_the_probe_reaches_scikit_learns_solution_of_the_same_objective(l2):
    """Our L-BFGS probe against the field's standard tool on the same standardised features: the
    same weights and the same class probabilities, to the solvers' tolerance."""
    x, y = labelled_features(1500, 0.3, 0)
    x, _ = standardise(x, x)
    weight, bias = fit_logistic_regression(x, y, l2=l2)
    reference = LogisticRegression(C=1 / (len(x) * l2), tol=1e-10, max_iter=10_000).fit(x.numpy(), y.numpy())
    assert weight.T.numpy() == pytest.approx(reference.coef_, abs=1e-2)
    ours = torch.softmax(x @ weight + bias, 1).numpy()
    # float32 L-BFGS stopped at its tolerances: within 0.002 at the probe's own, weakest, penalty
    assert ours == pytest.approx(reference.predict_proba(x.numpy()), abs=2e-3)
    assert (ours.argmax(1) == reference.predict(x.numpy())).mean() >= 0.998


def test_pooling_shapes():
    h = torch.randn(2, 16, 32, 32)
    assert [pool_features(h, p).shape[1] for p in ("gap", "avg2", "avg4", "none")] == [16, 64, 256, 16384]


def test_probing_leaves_the_backbone_unchanged_and_frozen_catches_changes():
    backbone = build_backbone("resnet32").train()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    train, test = synthetic_splits(200, 100)
    results = probe_layers(backbone, train, test, [1, 8, 16])
    assert [r["layer"] for r in results] == [1, 8, 16] and backbone.training
    assert all(torch.equal(before[k], v) for k, v in backbone.state_dict().items())
    with pytest.raises(RuntimeError, match="frozen network changed"):
        with frozen(backbone):
            backbone.train()(torch.randn(4, 3, 32, 32))  # a train-mode pass moves BN statistics
