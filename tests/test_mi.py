"""The I(h,x) and I(h,y) estimators on synthetic cases whose answers are known."""

import math

import pytest
import torch
import torch.nn.functional as F

from infopro.augment import to_unit
from infopro.data import synthetic_splits
from infopro.mi import (EstimatorSettings, image_entropy_floor, information_about_x, information_about_y,
                        null_input_baseline)

FAST = EstimatorSettings(epochs=10)
TRAIN, TEST = synthetic_splits(1500, 750)


def label_map(y, size=8):
    """h = one-hot label, constant over an 8x8 map."""
    return F.one_hot(y, 10).float()[:, :, None, None].expand(-1, -1, size, size).contiguous()


def noise(n, seed):
    return torch.randn(n, 4, 8, 8, generator=torch.Generator().manual_seed(seed))


def symmetric_noise(y, eps, seed):
    """Keep the label with probability 1-eps, else replace it by one of the 9 others uniformly."""
    generator = torch.Generator().manual_seed(seed)
    flip = torch.rand(len(y), generator=generator) < eps
    return torch.where(flip, (y + torch.randint(1, 10, (len(y),), generator=generator)) % 10, y)


def iy(train_h, test_h):
    return information_about_y(train_h, TRAIN.labels, test_h, TEST.labels, FAST)


def ix(train_h, test_h):
    return information_about_x(train_h, TRAIN.images, test_h, TEST.images, FAST)


def test_i_hy_of_noise_is_zero_and_of_the_label_is_h_y():
    assert abs(iy(noise(1500, 0), noise(750, 1))["ixy_normalised"]) < 0.02
    exact = iy(label_map(TRAIN.labels), label_map(TEST.labels))
    assert exact["ixy_normalised"] > 0.97
    assert exact["hy"] == pytest.approx(math.log(10), abs=1e-3)  # balanced labels


@pytest.mark.parametrize("eps", [0.2, 0.5])
def test_i_hy_of_a_noisy_label_matches_the_channel(eps):
    """y' = y kept with probability 1-eps, else one of the 9 others: I(y; y') is known.

    Compared with the oracle on the same test sample (the true channel probabilities scored
    on these 2000 labels), which removes the sample's own deviation from eps.
    """
    train_y, test_y = torch.arange(4000) % 10, torch.arange(2000) % 10
    train_obs, test_obs = symmetric_noise(train_y, eps, 1), symmetric_noise(test_y, eps, 2)
    flipped = (test_obs != test_y).float().mean().item()
    oracle = math.log(10) + (1 - flipped) * math.log(1 - eps) + flipped * math.log(eps / 9)
    population = math.log(10) + (1 - eps) * math.log(1 - eps) + eps * math.log(eps / 9)
    estimate = information_about_y(label_map(train_obs, 4), train_y, label_map(test_obs, 4), test_y,
                                   FAST)["ixy_nats"]
    assert estimate == pytest.approx(oracle, abs=0.04)
    assert estimate == pytest.approx(population, abs=0.1)


def test_i_hx_of_the_image_itself_is_nearly_all_and_of_noise_nothing():
    assert ix(to_unit(TRAIN.images), to_unit(TEST.images))["ixx_normalised"] > 0.85
    assert abs(ix(noise(1500, 0), noise(750, 1))["ixx_normalised"]) < 0.02


def test_i_hx_of_the_label_is_what_class_mean_colours_explain():
    """From a constant one-hot map a conv decoder can only paint each class's mean colour."""
    means = torch.stack([to_unit(TRAIN.images[TRAIN.labels == c]).mean(dim=(0, 2, 3)) for c in range(10)])
    prediction = means[TEST.labels][:, :, None, None].expand(-1, -1, 32, 32).clamp(1e-6, 1 - 1e-6)
    bce = F.binary_cross_entropy(prediction, to_unit(TEST.images)).item()
    baseline, floor = null_input_baseline(TRAIN.images, TEST.images), image_entropy_floor(TEST.images)
    analytic = (baseline - bce) / (baseline - floor)
    assert ix(label_map(TRAIN.labels), label_map(TEST.labels))["ixx_normalised"] == pytest.approx(analytic, abs=0.03)
