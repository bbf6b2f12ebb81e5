"""Our input pipeline against the usual one: one E2E epoch each, same model, device and invocation.

Ours (`infopro.train.train_epoch`): the split is resident on the device; crop, flip and
normalisation run there for the whole batch at once.
Reference, as the paper's code: a CPU DataLoader (one worker, shuffled) applying per-sample
transforms (to tensor, reflect-pad 4, random 32x32 crop, horizontal flip, normalise), then a
copy of each batch to the device. torchvision's transforms are used when importable (as the
authors did); otherwise the same operations written per sample with torch.
Each pipeline runs two epochs and the second is timed, so cuDNN autotuning and DataLoader
start-up of the first do not count against either.
"""

import time
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from infopro.augment import MEAN, STD
from infopro.config import TrainConfig, build_net
from infopro.data import Split
from infopro.device import autocast, configure_backends, place
from infopro.train import train_epoch


class PerSampleImages(Dataset):
    """uint8 CHW images served one at a time through a per-sample transform."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.transform(self.images[index]), self.labels[index]


def torch_per_sample(image: torch.Tensor) -> torch.Tensor:
    """The paper's training transform for one uint8 CHW image, written with torch."""
    x = F.pad(image.float().div(255)[None], (4, 4, 4, 4), mode="reflect")[0]
    top, left = torch.randint(0, 9, (2,)).tolist()
    x = x[:, top:top + 32, left:left + 32]
    if torch.rand(()) < 0.5:
        x = x.flip(-1)
    return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def reference_transform():
    """(per-sample transform, its name): torchvision's pipeline if importable, else torch's."""
    try:
        import torchvision.transforms as T
    except ImportError:
        return torch_per_sample, "torch per-sample"
    pipeline = T.Compose([
        T.Lambda(lambda image: F.pad(image.float().div(255)[None], (4, 4, 4, 4), mode="reflect")[0]),
        T.ToPILImage(), T.RandomCrop(32), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    return pipeline, "torchvision per-sample"


def timed(device: torch.device, run) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


def reference_epoch(net, optimizer, loader, device: torch.device, precision: str) -> None:
    net.train()
    for x, y in loader:
        x = x.to(device, non_blocking=False)
        y = y.to(device)
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = F.cross_entropy(net.backbone(x), y)
        loss.backward()
        optimizer.step()


def compare_pipelines(arch: str, images: int, batch_size: int, device: torch.device, precision: str = "fp32",
                      workers: int = 1) -> dict:
    """Seconds per E2E epoch of both pipelines on `images` random CIFAR-shaped images at `precision`
    (both under the same autocast), and their ratio."""
    configure_backends(device)
    generator = torch.Generator().manual_seed(0)
    data = Split(torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8, generator=generator),
                 torch.randint(0, 10, (images,), generator=generator))
    config = TrainConfig(arch=arch, regime="e2e", dataset="synthetic", batch_size=batch_size, precision=precision)
    transform, transform_name = reference_transform()
    loader = DataLoader(PerSampleImages(data.images, data.labels, transform), batch_size=batch_size,
                        shuffle=True, num_workers=workers, pin_memory=False)
    seconds = {}
    for name in ("ours", "reference"):
        net = place(build_net(config), device)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
        run = partial(train_epoch, net, optimizer, data.to(device), config, epoch=1) if name == "ours" \
            else partial(reference_epoch, net, optimizer, loader, device, precision)
        run()  # warm-up epoch: autotuning, worker start-up
        seconds[name] = timed(device, run)
    return {"arch": arch, "images": images, "batch_size": batch_size, "precision": precision,
            "loader_workers": workers, "reference_transforms": transform_name, "ours_epoch_seconds": seconds["ours"],
            "reference_epoch_seconds": seconds["reference"], "speedup": seconds["reference"] / seconds["ours"]}
