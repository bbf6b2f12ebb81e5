"""Shared fixtures: every test runs on CPU, offline, with a private dataset cache."""

import fcntl
import importlib.util
import io
import os
import pickle
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tarfile
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPRO_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def results_copy(tmp_path_factory) -> Path:
    """The committed results without model weights, so tests never touch the repository."""
    copy = tmp_path_factory.mktemp("results")
    shutil.copytree(REPO / "results", copy, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pt", "logs"))
    return copy


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


def run_main(*args, cwd=REPO) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS...` run inside this process, with what run_cli returns: the module's
    file runs under the name `__main__`, its `if __name__ == "__main__"` block included.

    For commands that must refuse their input before any work: a fresh interpreter spends 1 to 5 s
    importing torch, pandas and matplotlib, over two minutes across the refusal tests. An exception
    that escapes the command ends as the interpreter would end it, a traceback and exit 1, so a
    case that lost its one-line message still fails. SIGTERM's handler, the working folder and
    sys.argv are restored.
    """
    module, *options = args
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_argv, saved_cwd, saved_sigterm = sys.argv, os.getcwd(), signal.getsignal(signal.SIGTERM)
    sys.argv = [module, *options]
    os.chdir(cwd)
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr):
            returncode = exit_status(module)
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        signal.signal(signal.SIGTERM, saved_sigterm)
    return subprocess.CompletedProcess(args, returncode, stdout.getvalue(), stderr.getvalue())


def exit_status(module: str) -> int:
    """Run `module` as `__main__` and return the exit status the interpreter would give."""
    # By path: runpy.run_module warns about, and may reuse, a module an earlier test imported.
    try:
        runpy.run_path(importlib.util.find_spec(module).origin, run_name="__main__")
    except SystemExit as stop:
        return stop.code or 0  # the commands exit with a number, or None for 0
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return 1
    return 0


def python_block(page: str) -> str:
    """The first ```python block of a Markdown page of the repository: the example a test runs."""
    return re.search(r"```python\n(.*?)```", (REPO / page).read_text(), re.S).group(1)


def assert_free(run: Path) -> None:
    """Raises while a training still holds the run directory's lock (taken with flock)."""
    descriptor = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(descriptor)


def unfinished_copy(run: Path, to: Path, epochs: int) -> pd.DataFrame:
    """A committed run as if it had stopped after `epochs` epochs (no weights, no summary.json,
    metrics.csv cut back), so that a test of unfinished runs holds however far the committed grid
    has got. Returns the metrics kept."""
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("*.pt", "summary.json"))
    metrics = pd.read_csv(run / "metrics.csv").head(epochs)
    metrics.to_csv(to / "metrics.csv", index=False)
    return metrics
