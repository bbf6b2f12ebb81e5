"""What a lease's calls carry there and back: the working tree within one call's limit, the weights read last
left home, and the results a call wrote packed into parts that come back.

    python -m experiments.lease aside --carry .data          # here, before the lease's first call
    python -m experiments.lease home --parts FOLDER          # here, after its last call

A call to a lent machine carries the working tree (tracked and untracked-not-ignored files) and the
paths it names in `carry`, 64 MiB in all. The committed weights of the seed-0 networks and the
checkpoints of unfinished runs fill most of the tree, and the dataset's copy adds 18.5 MiB; the
weights of every further network that Table 2's baseline or the remainder estimator needs would
push a call over. One lease reaches only the first stages of the plan (experiments.stages), so
`aside` moves into a folder that git ignores (which therefore stays here) the weights no pending
stage reads, then those the latest stages read, until the rest fits. A remainder stage whose
weights stayed home is not in that lease's plan (its stage exists only beside its `model.pt`).
`home` unpacks the last call's parts, puts the weights back and removes the checkpoint of every run
that finished in the lease (the machine deleted it there; the tar parts cannot say so). On the machine,
`pack` writes what a call made into those parts (`experiments.reproduce --pack-to`, `lease wait`).
"""

import math
import os
import subprocess
import tarfile
from pathlib import Path

from infopro.errors import InfoProError
from infopro.records import is_temporary

WEIGHTS = ("model.pt", "checkpoint.pt")  # what a run directory holds that a stage may start from
MIB = 2**20


def travelling_files(root: Path) -> list[Path]:
    """The files a call carries without being told: tracked and untracked-not-ignored, as git lists them."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=root, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        raise InfoProError(f"{root} is not a git checkout: what a call carries is counted by git") from None
    return sorted({root / name for name in listed.split("\0") if name and (root / name).is_file()})


def carried_files(root: Path, carry: list[str]) -> list[Path]:
    """The files under the paths a call names in `carry` (relative to `root`)."""
    files = []
    for name in carry:
        path = root / name
        if not path.exists():
            raise InfoProError(f"--carry {name}: no such file or folder in {root}")
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return files


def call_bytes(root: Path, carry: list[str]) -> int:
    """What a call from `root` carrying `carry` brings to the machine, in bytes of its files."""
    return sum(path.stat().st_size for path in travelling_files(root) + carried_files(root, carry))


def reading_order(plan: list) -> dict[Path, int]:
    """Each file a pending stage of `plan` starts from (`Stage.reads`), with the position of the first
    such stage: the lower, the sooner the lease needs it."""
    order: dict[Path, int] = {}
    for position, stage in enumerate(plan):
        if not stage.done():
            for path in stage.reads():
                order.setdefault(path.resolve(), position)
    return order


def to_leave_home(weights: list[Path], order: dict[Path, int], excess: int) -> list[Path]:
    """The fewest-needed of `weights` that free at least `excess` bytes: first those no pending stage reads
    (largest first), then those the latest stages read."""
    ranked = sorted(weights, key=lambda path: (order.get(path.resolve(), math.inf), path.stat().st_size),
                    reverse=True)
    chosen, freed = [], 0
    for path in ranked:
        if freed >= excess:
            break
        chosen.append(path)
        freed += path.stat().st_size
    if freed < excess:
        raise InfoProError(f"the call is {excess / MIB:.1f} MiB over its limit, and leaving every weight home frees "
                           f"only {freed / MIB:.1f}: carry less")
    return chosen


def set_aside_files(aside: Path) -> list[Path]:
    return sorted(path for path in aside.rglob("*") if path.is_file()) if aside.is_dir() else []


def leave_home(root: Path, runs: Path, plan: list, carry: list[str], aside: Path, limit_bytes: int,
               log=print) -> list[Path]:
    """Move the weights under `runs` that the lease reads last into `aside` (under `root`, ignored by git)
    until the tree and `carry` come to at most `limit_bytes`; returns the files moved."""
    root, runs = root.resolve(), runs.resolve()
    if set_aside_files(aside):
        raise InfoProError(f"{aside} still holds the weights of an earlier lease: "
                           "`python -m experiments.lease home` puts them back first")
    total = call_bytes(root, carry)
    weights = [path for path in travelling_files(root) if path.name in WEIGHTS and path.is_relative_to(runs)]
    order = reading_order(plan)
    chosen = to_leave_home(weights, order, total - limit_bytes) if total > limit_bytes else []
    names = [stage.name for stage in plan]
    for path in chosen:
        reader = order.get(path.resolve())
        log(f"left home: {path.relative_to(root)} ({path.stat().st_size / MIB:.1f} MiB; "
            + ("no pending stage reads it)" if reader is None else f"{names[reader]} reads it)"))
        total -= path.stat().st_size
        target = aside / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
    log(f"a call carries {total / MIB:.1f} MiB (at most {limit_bytes / MIB:g})")
    return chosen


def unpack(parts: Path, root: Path, log=print) -> None:
    """Put a call's returned results parts (`pack` below) where they were made."""
    tars = sorted(parts.glob("results-*.tar"))
    if not tars:
        raise InfoProError(f"{parts}: no results-*.tar parts here (the folder a call's files came back to)")
    for part in tars:
        with tarfile.open(part) as tar:
            tar.extractall(root, filter="data")
        log(f"unpacked {part.name}")


def bring_home(root: Path, runs: Path, aside: Path, parts: Path | None = None, log=print) -> None:
    """Unpack `parts` (if given), put every set-aside weight back and remove the checkpoints of finished runs.
    A set-aside file whose place the lease filled stays in `aside`, and the call says so."""
    root, runs = root.resolve(), runs.resolve()
    if parts is not None:
        unpack(parts, root, log)
    kept = []
    for path in set_aside_files(aside):
        place = root / path.relative_to(aside)
        if place.exists():
            kept.append(place.relative_to(root))
            continue
        place.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, place)
        log(f"back home: {place.relative_to(root)}")
    for folder in [*sorted(aside.rglob("*"), reverse=True), aside] if aside.is_dir() else []:
        if folder.is_dir() and not any(folder.iterdir()):  # an empty `aside` would read as a lease still out
            folder.rmdir()
    for checkpoint in sorted(runs.glob("*/checkpoint.pt")):
        if (checkpoint.parent / "summary.json").is_file():
            checkpoint.unlink()
            log(f"removed {checkpoint.relative_to(root)}: its run finished")
    if kept:
        raise InfoProError(f"the lease wrote {', '.join(map(str, kept))}, which were set aside as well: the lease's "
                           f"copies are in place, the older ones still in {aside}")


TAR_BLOCK, TAR_RECORD = 512, 20 * 512


def results_since(results: Path, since: float) -> list[Path]:
    """The files under `results` written at or after `since` (seconds since the epoch), in path
    order: what one call made, the checkpoints of its unfinished runs included, and not the
    half-written temporaries of a training killed mid-write."""
    return [path for path in sorted(results.rglob("*"))
            if path.is_file() and not is_temporary(path) and path.stat().st_mtime >= since]


def tar_bytes(sizes: list[int]) -> int:
    """The size of an uncompressed tar holding files of `sizes`: a header block per member, its data
    padded to whole blocks, two closing blocks, the whole padded to a record."""
    blocks = sum(1 + -(-size // TAR_BLOCK) for size in sizes) + 2
    return -(-blocks * TAR_BLOCK // TAR_RECORD) * TAR_RECORD


def pack(files: list[Path], root: Path, out: Path, max_bytes: int) -> list[Path]:
    """Write `files` into tar parts `out/results-1.tar`, `-2`, ... of at most `max_bytes` each,
    named relative to `root` so that `tar xf PART` in the repository puts them back.

    Why: a lent GPU machine can be taken back between two calls, and only files under a size limit
    come back from a call. A call that packs its own results loses nothing when the machine is gone
    before the next one, and checkpoints of partial runs travel in parts small enough to come back.
    A file larger than `max_bytes` goes alone into its own part, which is then the only one over it.
    Parts of an earlier packing in `out` are removed first: packed again after every stage, a
    call's files may fill fewer parts than before (a checkpoint rewritten smaller), and a part
    left over would put older copies back.
    """
    for stale in out.glob("results-*.tar"):
        stale.unlink()
    groups: list[list[Path]] = []
    for path in files:
        if groups and tar_bytes([p.stat().st_size for p in groups[-1] + [path]]) <= max_bytes:
            groups[-1].append(path)
        else:
            groups.append([path])
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for number, group in enumerate(groups, start=1):
        part = out / f"results-{number}.tar"
        with tarfile.open(part, "w", format=tarfile.USTAR_FORMAT) as tar:
            for path in group:
                tar.add(path, arcname=str(path.relative_to(root)))
        parts.append(part)
    return parts
