"""Shared fixtures: every test runs on CPU, offline, with a private dataset cache."""

import fcntl
import io
import os
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPRO_CACHE_DIR", str(tmp_path / "cache"))


def cifar10_batches(per_batch: int = 20, seed: int = 0) -> dict[str, bytes]:
    """Pickled batches in the format of the original python release, with random pixels."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {}
    for name in names:
        record = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                  b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
                  b"batch_label": name.encode()}
        batches[name] = pickle.dumps(record)
    batches["batches.meta"] = pickle.dumps({b"label_names": [b"x"] * 10})
    return batches


def write_targz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return path


@pytest.fixture
def cifar10_archive(tmp_path) -> Path:
    """A small `cifar-10-python.tar.gz` (20 images per batch) in a fresh folder."""
    files = {f"cifar-10-batches-py/{name}": data for name, data in cifar10_batches().items()}
    root = tmp_path / "cifar"
    root.mkdir()
    return write_targz(root / "cifar-10-python.tar.gz", files)


def run_cli(*args, cwd=REPO, timeout=300):
    """Run `python -m ...` from the repository root; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def assert_free(run: Path) -> None:
    """Raises while a training still holds the run directory's lock (taken with flock)."""
    descriptor = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(descriptor)
