"""Data sources, their error messages, and the on-device augmentation."""

import hashlib
import io
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from conftest import cifar10_batches, write_targz
from infopro import augment, data
from infopro.config import TrainConfig
from infopro.errors import DataError
from infopro.train import train


def test_cifar10_from_archive_and_folder_agree(cifar10_archive, tmp_path):
    from_archive = data.load_dataset("cifar10", cifar10_archive.parent)
    folder = tmp_path / "unpacked" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, payload in cifar10_batches().items():
        (folder / name).write_bytes(payload)
    from_folder = data.load_dataset("cifar10", folder.parent)
    assert from_archive.train.images.shape == (100, 3, 32, 32)
    assert from_archive.test.images.shape == (20, 3, 32, 32)
    assert from_archive.fingerprint == from_folder.fingerprint
    # Pixel layout: the first 1024 bytes of a row are the red plane, row-major.
    first = pickle.loads(cifar10_batches()["data_batch_1"])[b"data"][0]
    assert torch.equal(from_archive.train.images[0, 0].flatten(), torch.from_numpy(first[:1024]))


def test_download_checks_md5(cifar10_archive, tmp_path):
    url = cifar10_archive.as_uri()
    md5 = hashlib.md5(cifar10_archive.read_bytes()).hexdigest()
    target = data.download_cifar10(tmp_path / "downloaded", url=url, md5=md5)
    assert data.load_dataset("cifar10", target.parent).fingerprint == \
        data.load_dataset("cifar10", cifar10_archive.parent).fingerprint
    with pytest.raises(DataError, match="checksum mismatch"):
        data.download_cifar10(tmp_path / "bad", url=url, md5="0" * 32)
    assert not (tmp_path / "bad").exists()


def test_missing_and_corrupt_cifar10(tmp_path):
    with pytest.raises(DataError, match="not found.*--download"):
        data.load_dataset("cifar10", tmp_path)
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"not a gzip file")
    with pytest.raises(DataError, match="corrupt archive"):
        data.load_dataset("cifar10", tmp_path)


def jpeg_tree_files(per_class: int = 2) -> dict[str, bytes]:
    """{split}/{class}/{i}.jpg|png files with solid colours that survive JPEG compression."""
    files = {}
    for split in ("train", "test"):
        for label, name in enumerate(data.CLASSES):
            for i in range(per_class):
                image = Image.new("RGB", (32, 32), (25 * label, 100, 200 - 10 * i))
                buffer = io.BytesIO()
                fmt = "PNG" if i % 2 else "JPEG"
                image.save(buffer, fmt)
                files[f"cifar10-jpeg/{split}/{name}/{i:04d}.{fmt.lower().replace('jpeg', 'jpg')}"] = buffer.getvalue()
    return files


def test_cifar10_jpeg_tree_archive_and_cache(tmp_path):
    files = jpeg_tree_files()
    for name, payload in files.items():
        (tmp_path / "tree" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / name).write_bytes(payload)
    archive = write_targz(tmp_path / "cifar10-jpeg.tar.gz", files)
    from_tree = data.load_dataset("cifar10-jpeg", tmp_path / "tree")
    from_archive = data.load_dataset("cifar10-jpeg", archive)
    assert from_tree.fingerprint == from_archive.fingerprint
    assert from_tree.train.labels.tolist() == [label for label in range(10) for _ in range(2)]
    assert abs(int(from_tree.train.images[-1, 0, 0, 0]) - 25 * 9) <= 3  # truck's red channel
    cached = list(data.cache_dir().glob("cifar10-jpeg-*.npz"))
    assert len(cached) == 2
    assert data.load_dataset("cifar10-jpeg", archive).fingerprint == from_archive.fingerprint


def test_a_truncated_cache_is_rebuilt_from_its_source(tmp_path):
    """A cache cut short (a full disk, a copy interrupted) once ended every later run in a
    zipfile.BadZipFile traceback until it was deleted by hand."""
    archive = write_targz(tmp_path / "cifar10-jpeg.tar.gz", jpeg_tree_files())
    whole = data.load_dataset("cifar10-jpeg", archive)
    (cache,) = data.cache_dir().glob("cifar10-jpeg-*.npz")
    cache.write_bytes(cache.read_bytes()[:1000])
    assert data.load_dataset("cifar10-jpeg", archive).fingerprint == whole.fingerprint
    assert cache.stat().st_size > 1000


def test_cifar10_jpeg_errors(tmp_path):
    with pytest.raises(DataError, match="cifar10-jpeg not found.*--data-root"):
        data.load_dataset("cifar10-jpeg", tmp_path)
    files = jpeg_tree_files(per_class=1)
    files["cifar10-jpeg/train/airplane/0000.jpg"] = b"garbage"
    with pytest.raises(DataError, match="not a readable image"):
        data.load_dataset("cifar10-jpeg", write_targz(tmp_path / "x.tar.gz", files))
    partial = {name: payload for name, payload in jpeg_tree_files().items() if "/test/cat/" not in name}
    with pytest.raises(DataError, match=r"test: an incomplete copy, .*\(airplane 2, automobile 2, bird 2, cat 0, "):
        data.load_dataset("cifar10-jpeg", write_targz(tmp_path / "partial.tar.gz", partial))
    truncated = write_targz(tmp_path / "y.tar.gz", jpeg_tree_files()).read_bytes()[:500]
    (tmp_path / "z.tar.gz").write_bytes(truncated)
    with pytest.raises(DataError, match="corrupt archive"):
        data.load_dataset("cifar10-jpeg", tmp_path / "z.tar.gz")


def test_synthetic_is_deterministic_and_balanced():
    a = data.load_dataset("synthetic")
    made_again = data.synthetic_splits.__wrapped__(*data.SYNTHETIC_SIZES)  # not the process's shared copy
    assert a.fingerprint == data.fingerprint(*made_again)
    assert a.train.labels.bincount().tolist() == [len(a.train) // 10] * 10
    assert a.train.images.dtype == torch.uint8 and a.train.images.shape[1:] == (3, 32, 32)


def test_a_training_leaves_the_shared_synthetic_splits_as_made(tmp_path, monkeypatch):
    """Every loader of the synthetic data shares one copy per process: nothing may change it in place.
    Whole splits (no subset, which would copy them), made small."""
    monkeypatch.setattr(data, "SYNTHETIC_SIZES", (200, 100))
    config = TrainConfig(regime="infopro", K=2, dataset="synthetic", epochs=1, batch_size=100)
    train(config, tmp_path / "run", device="cpu", log=lambda line: None)
    shared = data.load_dataset("synthetic")
    assert shared.fingerprint == data.fingerprint(*data.synthetic_splits.__wrapped__(200, 100))


def test_subset_is_fixed_whatever_the_seed():
    train = data.load_dataset("synthetic").train
    assert torch.equal(train.subset(100).labels, train.subset(100).labels)
    assert len(train.subset(100)) == 100 and train.subset(10**9) is train


def reference_crop_flip(image, dy, dx, flip):
    padded = F.pad(image[None].float(), (4, 4, 4, 4), mode="reflect")[0]
    crop = padded[:, dy:dy + 32, dx:dx + 32]
    return crop.flip(-1) if flip else crop


def test_crop_flip_matches_pad_crop_flip_at_every_offset():
    image = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    offsets = torch.cartesian_prod(torch.arange(9), torch.arange(9), torch.tensor([0, 1]))
    images = image.expand(len(offsets), -1, -1, -1)
    out = augment.crop_flip(images, offsets[:, 0], offsets[:, 1], offsets[:, 2].bool())
    for i, (dy, dx, flip) in enumerate(offsets.tolist()):
        assert torch.equal(out[i].float(), reference_crop_flip(image[0], dy, dx, flip)), (dy, dx, flip)


def test_augmentation_covers_all_offsets_and_flips_half():
    generator = torch.Generator().manual_seed(0)
    dy, dx, flip = augment.crop_flip_params(20000, generator)
    assert len(set(zip(dy.tolist(), dx.tolist()))) == 81
    assert 0.48 < flip.float().mean().item() < 0.52
    batch = augment.augmented_batch(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), generator)
    assert batch.dtype == torch.float32 and batch.shape == (4, 3, 32, 32)


def test_normalise_uses_paper_constants():
    unit = torch.tensor(augment.MEAN).view(1, 3, 1, 1).expand(1, 3, 2, 2)
    assert torch.allclose(augment.normalise(unit), torch.zeros(1, 3, 2, 2), atol=1e-6)
    assert np.allclose(np.array(augment.STD) * 255, (63.0, 62.1, 66.7))
