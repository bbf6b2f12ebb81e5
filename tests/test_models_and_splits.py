"""Architecture and split tables against the paper (docs/paper.md)."""

import pytest
import torch
import torch.nn.functional as F

from infopro.errors import InfoProError
from infopro.local import AuxHead, Decoder, upsample
from infopro.models import build_backbone
from infopro.splits import key_layer_points, loss_weights, module_ends


def test_resnet32_parameter_count_and_layer_points():
    net = build_backbone("resnet32")
    assert sum(p.numel() for p in net.parameters()) == 466_906
    assert net.num_layer_points == 16
    assert build_backbone("resnet110").num_layer_points == 55


def test_intermediates_are_the_forward_pass():
    net = build_backbone("resnet32").eval()
    x = torch.randn(2, 3, 32, 32)
    features = net.forward_intermediates(x, range(1, 17))
    assert [tuple(features[p].shape[1:]) for p in (1, 6, 7, 12, 16)] == \
        [(16, 32, 32), (16, 32, 32), (32, 16, 16), (64, 8, 8), (64, 8, 8)]
    assert all(tuple(features[p].shape[1:]) == net.layer_shape(p) for p in features)
    assert torch.allclose(net.head(features[16]), net(x))


# Module ends as "ends after global block g" in the paper's code; layer point L = g + 1, stem = 1.
PAPER_ENDS = {
    ("resnet32", "paper", 2): [7], ("resnet32", "paper", 3): [5, 10], ("resnet32", "paper", 4): [3, 7, 11],
    ("resnet32", "paper", 8): [1, 3, 5, 7, 9, 11, 13], ("resnet32", "paper", 16): list(range(0, 15)),
    ("resnet110", "paper", 2): [27], ("resnet110", "paper", 3): [18, 36],
    ("resnet110", "paper", 4): [12, 26, 40], ("resnet110", "paper", 8): [5, 12, 19, 26, 33, 40, 47],
    ("resnet110", "paper", 16): [2, 5, 8, 11, 14, 17, 20, 23, 26, 30, 34, 38, 42, 46, 50],
    ("resnet110", "balanced", 2): [15], ("resnet110", "balanced", 3): [10, 21],
    ("resnet110", "balanced", 4): [7, 15, 27],
}


@pytest.mark.parametrize("arch,split,K", sorted(PAPER_ENDS))
def test_split_tables_match_the_paper(arch, split, K):
    assert module_ends(arch, K, split) == [g + 1 for g in PAPER_ENDS[(arch, split, K)]]


def test_custom_splits_and_their_errors():
    assert module_ends("resnet32", 3, "4,9") == [4, 9]
    assert module_ends("resnet32", 1) == []
    for K, split, message in [(3, "4", "gives 2 modules"), (3, "9,4", "increase strictly"),
                              (2, "16", "increase strictly"), (2, "a", "comma-separated"),
                              (5, "paper", "no paper split table"), (3, "balanced", "no balanced split")]:
        with pytest.raises(InfoProError, match=message):
            module_ends("resnet32", K, split)


def test_key_layer_points_are_the_first_the_module_ends_and_the_last_but_every_point_of_e2e():
    assert key_layer_points("resnet32", 1) == list(range(1, 17))
    assert key_layer_points("resnet32", 2) == [1, 8, 16]
    assert key_layer_points("resnet32", 16) == list(range(1, 17))
    assert key_layer_points("resnet110", 4, "balanced") == [1, *module_ends("resnet110", 4, "balanced"), 55]
    assert key_layer_points("resnet32", 3, "1,9") == [1, 9, 16]  # a module end at layer 1 counts once


def test_loss_weights_interpolate_linearly_between_first_and_last_module():
    weights = loss_weights("resnet32", 4, "paper")
    assert weights.lambda1 == (6, 3.5, 1) and weights.lambda2 == (0, 1, 2)
    assert loss_weights("resnet32", 2, "paper").lambda1 == (5,)
    k16 = loss_weights("resnet32", 16, "paper")
    assert len(k16.lambda1) == 15 and k16.lambda1[0] == 5 and abs(k16.lambda1[-1] - 0.2) < 1e-12
    assert loss_weights("resnet110", 4, "balanced").lambda2 == (0, 0.05, 0.1)
    assert loss_weights("resnet32", 3, "4,9", (2, 1), (0, 1)).lambda1 == (2, 1)
    with pytest.raises(InfoProError, match="gives no λ1/λ2"):
        loss_weights("resnet32", 3, "paper")


def test_auxiliary_head_and_decoder_match_the_paper():
    # docs/paper.md: 16 ch @32 -> conv 16->32 s2; 32 ch @16 -> 32->64 s2; 64 ch @8 -> 64->64 s1.
    for channels, size, out, stride in [(16, 32, 32, 2), (32, 16, 64, 2), (64, 8, 64, 1)]:
        conv, fc1, fc2 = (m for m in AuxHead(channels, size, 128).modules()
                          if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)))
        assert (conv.in_channels, conv.out_channels, conv.stride) == (channels, out, (stride, stride))
        assert (fc1.in_features, fc1.out_features, fc2.out_features) == (out, 128, 128)
    decoder = Decoder(32)
    assert decoder(torch.randn(2, 32, 16, 16)).shape == (2, 3, 32, 32)
    assert [m.out_channels for m in decoder.modules() if isinstance(m, torch.nn.Conv2d)] == [12, 3]


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_decoder_upsampling_is_corner_aligned_bilinear_bit_for_bit(memory_format):
    """The decoder up-samples channels-last for speed; its numbers, forward and backward, must
    be exactly those of NCHW corner-aligned bilinear interpolation, which CPU runs were trained
    with, and it must hand the convolution the memory format it was given."""
    h = torch.randn(3, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(3, 16, 32, 32, generator=torch.Generator().manual_seed(1))
    reference_h = h.clone().requires_grad_()
    reference = F.interpolate(reference_h, size=(32, 32), mode="bilinear", align_corners=True)
    reference.backward(grad)
    ours_h = h.contiguous(memory_format=memory_format).requires_grad_()
    ours = upsample(ours_h, 32)
    ours.backward(grad)
    assert ours.is_contiguous(memory_format=memory_format)
    assert torch.equal(ours, reference) and torch.equal(ours_h.grad, reference_h.grad)
