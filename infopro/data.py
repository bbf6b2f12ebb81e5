"""CIFAR-10 as whole-split uint8 tensors, and the paper's augmentation run on the training device.

Three sources share one interface, `load_dataset(name, root)`:

* ``cifar10``      the original python-pickle CIFAR-10 (`cifar-10-batches-py/` or
                   `cifar-10-python.tar.gz`), optionally downloaded and md5-checked;
* ``cifar10-jpeg`` a tree `{train,test}/<class>/*.jpg|png` or a `.tar.gz` of one (the lossy
                   JPEG copy these machines have); decoded once and cached as `.npz`;
* ``synthetic``    deterministic, learnable class-conditional images for tests and smoke runs.

The whole split lives on the training device as uint8 (150 MB for CIFAR-10's train set), where
`infopro.augment` crops, flips and normalises each batch.
"""

import functools
import hashlib
import io
import os
import pickle
import tarfile
import urllib.request
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from infopro.errors import DataError
from infopro.records import atomic_write

DATASETS = ("cifar10", "cifar10-jpeg", "synthetic")
CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
           "dog", "frog", "horse", "ship", "truck")
IMAGE_SHAPE = (3, 32, 32)

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
JPEG_ARCHIVE = "cifar10-jpeg.tar.gz"
JPEG_FOLDER = "cifar10-jpeg"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")

DEFAULT_ROOTS = {"cifar10": "data", "cifar10-jpeg": ".data"}
SYNTHETIC_SIZES = (5000, 1000)  # train, test


@dataclass(frozen=True)
class Split:
    """One split: `images` (N, 3, 32, 32) uint8 and `labels` (N,) int64, on one device."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device) -> "Split":
        return Split(self.images.to(device), self.labels.to(device))

    def subset(self, n: int | None) -> "Split":
        """The first `n` images of a fixed random permutation (seed 0, whatever the run seed).

        Every run that asks for the same `n` gets the same images, so runs of a grid that
        differ only in their seed or regime are compared on identical data.
        """
        if n is None or n >= len(self):
            return self
        order = subset_indices(len(self), n).to(self.labels.device)
        return Split(self.images[order], self.labels[order])

    @property
    def nbytes(self) -> int:
        return self.images.nbytes + self.labels.nbytes


def subset_indices(size: int, n: int) -> torch.Tensor:
    """Indices of `Split.subset(n)` in a split of `size` images: also which images a run never saw."""
    if n < 1:
        raise DataError(f"subset size must be positive, got {n}")
    return torch.randperm(size, generator=torch.Generator().manual_seed(0))[:n]


@dataclass(frozen=True)
class Dataset:
    """Both splits, the dataset's name and a fingerprint of its pixels and labels."""

    name: str
    train: Split
    test: Split
    fingerprint: str
    source: str


def dataset_source(name: str, root: str | os.PathLike | None = None, download: bool = False) -> Path | None:
    """The folder or archive `name` is read from (None: generated); `root` defaults to `data/` (cifar10)
    or `.data/` (jpeg). Cheap, so that a command starting many trainings can refuse missing data first."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    if name == "synthetic":
        return None
    root = Path(root if root is not None else DEFAULT_ROOTS[name])
    return find_cifar10(root, download) if name == "cifar10" else find_cifar10_jpeg(root)


def load_dataset(name: str, root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Load a whole dataset on the CPU (see `dataset_source` for where from)."""
    source = dataset_source(name, root, download)
    if source is None:
        train, test = synthetic_splits(*SYNTHETIC_SIZES)
        return Dataset(name, train, test, fingerprint(train, test), "generated")
    train, test = read_cifar10(source) if name == "cifar10" else read_cifar10_jpeg_cached(source)
    return Dataset(name, train, test, fingerprint(train, test), str(source))


def fingerprint(train: Split, test: Split) -> str:
    """sha256 (first 16 hex digits) of the pixels and labels: names exactly which data a run saw."""
    digest = hashlib.sha256()
    for tensor in (train.images, train.labels, test.images, test.labels):
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def as_split(images: np.ndarray, labels, where: str) -> Split:
    """Validate shapes and wrap numpy arrays as a `Split`."""
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.asarray(labels, dtype=np.int64)
    if images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
        raise DataError(f"{where}: expected images of shape (N, 3, 32, 32) with N labels, "
                        f"got {images.shape} and {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(CLASSES)):
        raise DataError(f"{where}: labels outside 0..{len(CLASSES) - 1}")
    return Split(torch.from_numpy(images), torch.from_numpy(labels))


# --------------------------------------------------------------------------------------------
# cifar10: the original python-pickle release

def find_cifar10(root: Path, download: bool) -> Path:
    """The folder or archive to read, downloading the archive into `root` if asked."""
    for candidate in (root, root / CIFAR10_FOLDER, root / CIFAR10_ARCHIVE):
        if candidate.is_dir() and (candidate / CIFAR10_TEST_BATCH).is_file():
            return candidate
        if candidate.is_file() and candidate.name.endswith(".tar.gz"):
            return candidate
    if download:
        return download_cifar10(root)
    raise DataError(f"CIFAR-10 not found in {root}/ (expected {CIFAR10_FOLDER}/ or {CIFAR10_ARCHIVE}); "
                    f"pass --download to fetch it from {CIFAR10_URL}, or --data-root PATH")


def download_cifar10(root: Path, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5) -> Path:
    """Fetch the archive to `root/cifar-10-python.tar.gz`, keeping it only if its md5 matches."""
    target = root / CIFAR10_ARCHIVE
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            payload = response.read()
    except OSError as error:
        raise DataError(f"could not download {url}: {error}") from None
    actual = hashlib.md5(payload).hexdigest()
    if actual != md5:
        raise DataError(f"checksum mismatch for {url}: md5 {actual}, expected {md5}; nothing was saved")
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(target, payload)
    return target


def read_cifar10(source: Path) -> tuple[Split, Split]:
    """Read the five training batches and the test batch from a folder or the `.tar.gz`."""
    if source.is_dir():
        def read(name):
            return (source / name).read_bytes()
        return cifar10_splits(read, str(source))
    try:
        with tarfile.open(source, "r:gz") as archive:
            members = {Path(m.name).name: m for m in archive.getmembers() if m.isfile()}

            def read(name):
                if name not in members:
                    raise DataError(f"{source}: archive has no {name}; is it cifar-10-python.tar.gz?")
                return archive.extractfile(members[name]).read()
            return cifar10_splits(read, str(source))
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise DataError(f"corrupt archive {source}: {error}") from None


def cifar10_splits(read, where: str) -> tuple[Split, Split]:
    """Decode CIFAR-10 pickle batches fetched by name with `read(name) -> bytes`."""
    def batch(name):
        try:
            record = pickle.loads(read(name), encoding="bytes")
            data, labels = record[b"data"], record[b"labels"]
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as error:
            raise DataError(f"{where}: {name} is not a CIFAR-10 batch ({error})") from None
        return np.asarray(data, dtype=np.uint8).reshape(-1, *IMAGE_SHAPE), labels

    train = [batch(name) for name in CIFAR10_TRAIN_BATCHES]
    test_images, test_labels = batch(CIFAR10_TEST_BATCH)
    return (as_split(np.concatenate([b[0] for b in train]), sum((list(b[1]) for b in train), []), where),
            as_split(test_images, test_labels, where))


# --------------------------------------------------------------------------------------------
# cifar10-jpeg: image files in {train,test}/<class>/, as a tree or a .tar.gz

def find_cifar10_jpeg(root: Path) -> Path:
    """The tree or archive to read: `root` itself, or `cifar10-jpeg/` or the archive inside it."""
    for candidate in (root, root / JPEG_FOLDER, root / JPEG_ARCHIVE):
        if candidate.is_dir() and (candidate / "train").is_dir() and (candidate / "test").is_dir():
            return candidate
        if candidate.is_file() and candidate.name.endswith(".tar.gz"):
            return candidate
    raise DataError(f"cifar10-jpeg not found in {root}/ (expected {JPEG_ARCHIVE} or a folder with "
                    f"train/<class>/ and test/<class>/); put it there (`mkdir -p .data` and copy "
                    f"{JPEG_ARCHIVE} into it), or pass --data-root PATH")


def cache_dir() -> Path:
    """Where decoded image trees are cached: $INFOPRO_CACHE_DIR, else ~/.cache/infopro."""
    return Path(os.environ.get("INFOPRO_CACHE_DIR", Path.home() / ".cache" / "infopro"))


def source_digest(source: Path) -> str:
    """Cheap identity of an archive (its bytes) or a tree (file names and sizes), for the cache key."""
    digest = hashlib.sha256()
    if source.is_file():
        with open(source, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    else:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                digest.update(f"{path.relative_to(source)}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def read_cifar10_jpeg_cached(source: Path) -> tuple[Split, Split]:
    """Decode once (about 5 s for 60k images), then load the `.npz` cache (well under a second)."""
    cache = cache_dir() / f"cifar10-jpeg-{source_digest(source)}.npz"
    if cache.is_file():
        try:
            with np.load(cache) as arrays:
                return (as_split(arrays["train_images"], arrays["train_labels"], str(cache)),
                        as_split(arrays["test_images"], arrays["test_labels"], str(cache)))
        except (OSError, ValueError, KeyError, zlib.error, EOFError, zipfile.BadZipFile):
            pass  # a damaged cache (a truncated copy, a full disk) is rebuilt from the source below
    train, test = read_cifar10_jpeg(source)
    buffer = io.BytesIO()
    np.savez(buffer, train_images=train.images.numpy(), train_labels=train.labels.numpy(),
             test_images=test.images.numpy(), test_labels=test.labels.numpy())
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, buffer.getvalue())
    return train, test


def read_cifar10_jpeg(source: Path) -> tuple[Split, Split]:
    """Decode every image; labels are class-folder indices in CIFAR-10 order (= sorted names)."""
    files = {"train": {}, "test": {}}  # split -> {(class, file name): bytes}
    if source.is_dir():
        for split in files:
            for path in (source / split).glob("*/*"):
                if path.suffix.lower() in IMAGE_SUFFIXES:
                    files[split][(path.parent.name, path.name)] = path.read_bytes()
    else:
        try:
            with tarfile.open(source, "r:gz") as archive:
                for member in archive:
                    parts = Path(member.name).parts
                    if member.isfile() and len(parts) >= 3 and parts[-3] in files \
                            and Path(parts[-1]).suffix.lower() in IMAGE_SUFFIXES:
                        files[parts[-3]][(parts[-2], parts[-1])] = archive.extractfile(member).read()
        except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
            raise DataError(f"corrupt archive {source}: {error}") from None
    return tuple(decode_images(files[split], f"{source}:{split}") for split in ("train", "test"))


def check_complete(counts: Counter, where: str) -> None:
    """Every CIFAR-10 class holds the same number of images in each split. A missing or short class
    folder is a partial copy (an interrupted extraction or copy), whose runs must not be recorded
    under the dataset's name."""
    unknown = sorted(set(counts) - set(CLASSES))
    if not counts or unknown:
        raise DataError(f"{where}: expected class folders {', '.join(CLASSES)}; "
                        f"found {'none' if not counts else ', '.join(unknown)}")
    if len({counts[cls] for cls in CLASSES}) > 1:
        raise DataError(f"{where}: an incomplete copy, its class folders hold unequal numbers of images "
                        f"({', '.join(f'{cls} {counts[cls]:,}' for cls in CLASSES)}); extract or copy it again")


def decode_images(files: dict, where: str) -> Split:
    """Decode {(class, name): bytes} into a Split, ordered by class then file name."""
    from PIL import Image, UnidentifiedImageError

    check_complete(Counter(cls for cls, _ in files), where)
    keys = sorted(files, key=lambda key: (CLASSES.index(key[0]), key[1]))
    images = np.empty((len(keys), 32, 32, 3), dtype=np.uint8)
    for i, key in enumerate(keys):
        try:
            with Image.open(io.BytesIO(files[key])) as image:
                pixels = np.asarray(image.convert("RGB"))
        except UnidentifiedImageError:
            raise DataError(f"{where}/{key[0]}/{key[1]}: not a readable image (not an image format)") from None
        except OSError as error:
            raise DataError(f"{where}/{key[0]}/{key[1]}: not a readable image ({error})") from None
        if pixels.shape != (32, 32, 3):
            raise DataError(f"{where}/{key[0]}/{key[1]}: expected 32x32 pixels, got {pixels.shape[:2]}")
        images[i] = pixels
    labels = [CLASSES.index(cls) for cls, _ in keys]
    return as_split(images.transpose(0, 3, 1, 2), labels, where)


# --------------------------------------------------------------------------------------------
# synthetic: learnable class-conditional images

@functools.lru_cache(maxsize=4)
def synthetic_splits(n_train: int, n_test: int, seed: int = 0) -> tuple[Split, Split]:
    """Class templates (a colour plus a smooth pattern) blended with random backgrounds and noise.

    Deterministic (fixed seed) and balanced. Each image is 80% its class template and 20% a
    random smooth background, plus pixel noise: a ResNet-32 learns it to well under 50% error
    within two short epochs on 1000 images, which is what the smoke tests need. Made once per
    process (half a second for the 6,000 images of `load_dataset`, which every training of the
    tests would pay again); a `Split` is never changed in place, so its users may share it.
    """
    generator = torch.Generator().manual_seed(seed)
    colours = torch.rand(len(CLASSES), 3, 1, 1, generator=generator)
    templates = 0.5 * colours + 0.5 * smooth_images(len(CLASSES), generator)

    def split(n):
        labels = torch.arange(n) % len(CLASSES)
        labels = labels[torch.randperm(n, generator=generator)]
        background = smooth_images(n, generator)
        noise = 0.05 * torch.randn(n, *IMAGE_SHAPE, generator=generator)
        images = (0.8 * templates[labels] + 0.2 * background + noise).clamp(0, 1)
        return Split((images * 255).round().to(torch.uint8), labels)

    return split(n_train), split(n_test)


def smooth_images(n: int, generator: torch.Generator) -> torch.Tensor:
    """Random low-frequency colour images in [0, 1]: 4x4 noise upsampled bilinearly to 32x32."""
    coarse = torch.rand(n, 3, 4, 4, generator=generator)
    return F.interpolate(coarse, size=IMAGE_SHAPE[1:], mode="bilinear", align_corners=False)
