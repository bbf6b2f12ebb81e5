"""Result files with provenance, written atomically so a killed run never leaves half a file.

Every record this repository writes names the code (git commit and dirty flag), the
software (torch, CUDA, cuDNN), the hardware and the numerics it came from.
"""

import csv
import fcntl
import io
import json
import math
import numbers
import os
import pickle
import platform
import re
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from infopro.errors import DataError

REPO_ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = "unknown"  # a provenance field nobody could read
TEMPORARY_SUFFIX = ".tmp"  # atomic_write's half-written files: a process killed (SIGKILL) mid-write leaves one


def encode_correct(correct) -> str:
    """Right/wrong per image as hex, one bit per image (10,000 images: 2,500 characters)."""
    return np.packbits(np.asarray(correct, dtype=bool)).tobytes().hex()


def decode_correct(text: str, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bytes.fromhex(text), dtype=np.uint8), count=n).astype(bool)


def is_temporary(path: Path) -> bool:
    """Whether `path` is one of atomic_write's temporaries, never a result."""
    return path.name.startswith(".") and path.name.endswith(TEMPORARY_SUFFIX)


def atomic_write(path: str | os.PathLike, payload: bytes | str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = payload.encode() if isinstance(payload, str) else payload
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_writable(folder: str | os.PathLike) -> None:
    """Create `folder` and make (then drop) a file in it, or say in one line why results cannot go there.

    Why: analyses and benchmarks write their results after minutes to hours of work; a folder that
    refuses them (a file in its place, no permission, a read-only mount) must stop the command before
    that work starts, not after it.
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".writable-", suffix=TEMPORARY_SUFFIX):
            pass
    except OSError as error:
        raise DataError(f"cannot write results in {folder}: {error.strerror}") from None


def write_json(path, record) -> None:
    atomic_write(path, json.dumps(record, indent=2, sort_keys=False) + "\n")


def read_json(path, keys: tuple[str, ...] = ()) -> dict:
    """A record this repository wrote; a file edited into invalid JSON, or without the `keys` its
    reader needs, is one line naming it."""
    remedy = "restore it from git or from the run that wrote it"
    try:
        record = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise DataError(f"{path} is not valid JSON ({error.msg}, line {error.lineno}); {remedy}") from None
    if missing := [key for key in keys if not isinstance(record, dict) or key not in record]:
        raise DataError(f"{path} lacks {', '.join(missing)}; {remedy}")
    return record


def write_csv(path, rows: list[dict]) -> None:
    """Rows as a CSV file (written atomically); columns in order of first appearance, blank where absent
    or missing.

    Rows may differ in keys: a run resumed by the other trainer adds the module-parallel columns.
    """
    buffer = io.StringIO()
    if rows:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: csv_cell(value) for key, value in row.items()} for row in rows)
    atomic_write(path, buffer.getvalue())


@contextmanager
def locked(folder: Path):
    """Hold an exclusive lock on `folder` for the block; another process's block on it waits. The OS
    drops the lock with the process, so a killed holder leaves nothing stale."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def update_csv(path, read: Callable[[Path], pd.DataFrame],
               change: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
    """Re-read the CSV at `path` (an empty table if there is none), `change` it and write it back
    atomically, all under a lock on its folder; returns the table written.

    Why: an analysis rewrites its whole CSV after each run. Two of them writing one CSV at once (a
    `--only` selection in each of two terminals) would each write back the table it started from,
    the last dropping the other's rows without a word; re-read under the lock, both are kept.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.parent):
        table = change(read(path) if path.exists() else pd.DataFrame())
        write_csv(path, table.to_dict("records"))
    return table


def read_table(path, remedy: str, columns: tuple[str, ...] = (), rows=None, may_be_blank: tuple[str, ...] = (),
               **options) -> pd.DataFrame:
    """A CSV this repository wrote, as a table (`options` go to pandas); with `rows` (table -> table),
    only the rows its reader keeps, e.g. a benchmark's measured ones, whose failed methods' rows hold
    nothing but their error.

    An empty, garbled or cut file, or one whose kept rows lack the `columns` its reader needs, or
    leave one of them blank, is one line naming it and `remedy`: otherwise the reader would fail
    deep inside a figure or an analysis, or draw a garbled row. No row kept: an empty table. The
    columns `may_be_blank` must be there but may be blank: a reader that keeps a failed
    measurement's row (its time blank) to know what failed.
    """
    try:
        table = pd.read_csv(path, **options)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is empty, garbled or cut short ({type(error).__name__}); {remedy}") from None
    if rows is not None:
        table = rows(table)
        if table.empty:
            return table
    if missing := [column for column in (*columns, *may_be_blank) if column not in table.columns]:
        raise DataError(f"{path} lacks the column{'s' * (len(missing) > 1)} {', '.join(missing)}; {remedy}")
    blank = table[list(columns)].isna()
    if blank.any(axis=None):
        column = blank.any().idxmax()
        row = blank[column].idxmax()
        raise DataError(f"{path} has a blank {column} in data row {row + 1}; {remedy}")
    return table


def equal_as_read(column: pd.Series, value) -> pd.Series:
    """Which cells of a column read back from CSV equal `value`: numbers as numbers, since pandas
    reads a column with blank cells as float (a remainder row leaves the 1c2f estimator's settings
    blank, so its `est_epochs` 10 comes back as 10.0), anything else as text."""
    numeric = pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    if numeric and isinstance(value, numbers.Number) and not isinstance(value, bool):
        return column == value
    return column.astype(str) == str(value)


def csv_cell(value):
    """A missing value as a blank cell. Rows taken from a pandas table hold NaN where a cell is
    missing, which the csv module would write as the text 'nan'."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else value


def save_torch(path, obj) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, buffer.getvalue())


def load_torch(path, remedy: str):
    """What `save_torch` wrote to `path`, on the CPU. `save_torch` never leaves half a file, but a
    copy can be truncated or a disk can fail: that is one line naming the file and `remedy`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        raise DataError(f"{path} is corrupt, truncated or not a file this repository wrote "
                        f"({type(error).__name__}); {remedy}") from None


def git_state(root=REPO_ROOT) -> dict:
    """Commit and dirty flag of the source tree: `announced_git_state()` where $INFOPRO_GIT_COMMIT
    is set or there is no .git, else git's answer.

    The announcement wins over a .git: a lent GPU was seen to receive the history as of an
    earlier commit, so git there named that commit, dirty, instead of the code sent. Files
    under results/ do not count as dirty: they are outputs, and the analyses append to
    committed CSVs there, which would otherwise mark every row after a run's first as made
    from uncommitted code.
    """
    if os.environ.get("INFOPRO_GIT_COMMIT", "").strip():
        return announced_git_state()

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"))
    except (OSError, subprocess.SubprocessError):
        return announced_git_state()
    return {"git_commit": commit, "git_dirty": dirty}


def announced_git_state() -> dict:
    """$INFOPRO_GIT_COMMIT and $INFOPRO_GIT_DIRTY (0 or 1), "unknown" where unset or unreadable.

    A machine that receives a copy of the working tree without its history (a lent GPU, say)
    cannot ask git; whoever sends the copy names its commit this way, so that results made
    there still name their code. The flag is parsed to the boolean git would have given.
    """
    flag = os.environ.get("INFOPRO_GIT_DIRTY", "").strip().lower()
    dirty = {"0": False, "false": False, "1": True, "true": True}.get(flag, UNKNOWN)
    return {"git_commit": os.environ.get("INFOPRO_GIT_COMMIT", "").strip() or UNKNOWN, "git_dirty": dirty}


def cpuinfo() -> dict[str, str]:
    """The first processor's entries in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    entries = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        entries[key.strip()] = value.strip()
    return entries


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name (from /proc/cpuinfo where there is one)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpuinfo().get("model name") or platform.processor() or platform.machine() or "cpu"


def device_slug(device: torch.device) -> str:
    """The device as result files name it: `cpu`, or its GPU's `name_slug`."""
    return "cpu" if device.type == "cpu" else name_slug(device_name(device))


def name_slug(name: str) -> str:
    """A GPU's name as file names carry it ("NVIDIA H100 80GB HBM3": nvidia-h100-80gb-hbm3)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def processor(device: torch.device) -> dict:
    """The processor, named as precisely as its kernels need: a CPU's model name alone can hide
    the generation (virtual machines report "AMD EPYC" for several), so a CPU also gets the vector
    instruction set ATen dispatches to and its family, model and stepping numbers."""
    record = {"device_name": device_name(device)}
    if device.type == "cpu":
        entries = cpuinfo()
        generation = [f"{key} {entries[key]}" for key in ("cpu family", "model", "stepping") if key in entries]
        record.update({"cpu_capability": torch.backends.cpu.get_cpu_capability(),
                       "cpu_generation": ", ".join(generation) or UNKNOWN})
    return record


def provenance(device: torch.device) -> dict:
    """Code, software, hardware and numerics settings, for every result record."""
    record = git_state()
    record.update({
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "device": device.type,
        **processor(device),
        "cpu_threads": torch.get_num_threads(),
        "host": platform.node(),
    })
    if device.type == "cuda":
        record.update({
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "tf32_conv": torch.backends.cudnn.allow_tf32,
            "tf32_matmul": torch.get_float32_matmul_precision() != "highest",
        })
    return record
