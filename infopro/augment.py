"""The paper's augmentation and normalisation, run on the training device on whole uint8 batches.

Random crop (4-pixel reflect padding) and horizontal flip with a single gather per batch, then the
paper's per-channel normalisation: no DataLoader and no per-sample Python, which is what makes an
epoch take about a second on a GPU. Every draw comes from the caller's generator, so a batch is a
function of (seed, epoch) and a resumed run draws what the uninterrupted one would have.
"""

import functools

import torch

# Normalisation of the paper's code (docs/paper.md): per-channel mean and std of CIFAR-10 in [0, 1].
MEAN = (125.3 / 255, 123.0 / 255, 113.9 / 255)
STD = (63.0 / 255, 62.1 / 255, 66.7 / 255)


def crop_flip_params(n: int, generator: torch.Generator, pad: int = 4):
    """Per-sample crop offsets in [0, 2*pad] and a fair coin for the horizontal flip."""
    device = generator.device
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=device)
    flip = torch.rand(n, generator=generator, device=device) < 0.5
    return dy, dx, flip


def reflect_index(index: torch.Tensor, size: int) -> torch.Tensor:
    """Map indices in [-size+1, 2*size-2] onto [0, size) as reflect padding does (edge not repeated)."""
    index = index.abs()
    return torch.where(index >= size, 2 * (size - 1) - index, index)


def crop_flip(images: torch.Tensor, dy, dx, flip, pad: int = 4) -> torch.Tensor:
    """Reflect-pad by `pad`, crop back to the input size at (dy, dx), flip where asked: one gather.

    Equivalent to the paper's pad-crop-flip pipeline per sample (a test checks every offset
    against F.pad + slicing), but computed for the whole batch at once without materialising
    the padded images.
    """
    n, channels, height, width = images.shape
    rows = reflect_index(dy[:, None] + torch.arange(height, device=images.device) - pad, height)
    cols = dx[:, None] + torch.arange(width, device=images.device) - pad
    cols = reflect_index(torch.where(flip[:, None], cols.flip(1), cols), width)
    batch = torch.arange(n, device=images.device)[:, None, None, None]
    channel = torch.arange(channels, device=images.device)[None, :, None, None]
    return images[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels to float in [0, 1]: the decoder's reconstruction target."""
    return images.float().div_(255)


def normalise(unit: torch.Tensor) -> torch.Tensor:
    """The paper's per-channel standardisation of [0, 1] images: the network's input."""
    mean, std = channel_statistics(unit.device)
    return (unit - mean) / std


@functools.cache
def channel_statistics(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """MEAN and STD as (1, 3, 1, 1) tensors on `device`, made once per device.

    Copying them from host memory at every step would make CUDA wait for the GPU to finish its
    queue (a stream sync) before each batch. Made outside inference mode, so that a first call
    from evaluation does not give training tensors it cannot save for backward.
    """
    with torch.inference_mode(False):
        return tuple(torch.tensor(values, device=device).view(1, 3, 1, 1) for values in (MEAN, STD))


def augmented_batch(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A training batch in [0, 1]: random reflect-pad-4 crop and flip, each drawn per sample."""
    return to_unit(crop_flip(images, *crop_flip_params(len(images), generator)))


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator):
    """Index tensors of one epoch's batches, in a random order; the last batch may be short."""
    return torch.randperm(n, generator=generator, device=generator.device).split(batch_size)
