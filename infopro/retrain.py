"""Train a finished run again from its config.json and check that it comes out the same, number for number.

Training on the CPU is deterministic here: the initial weights, and each epoch's shuffling and
augmentation, are drawn from generators seeded by the run's seed (and the epoch), so the same
config on the same data, processor and software gives the same losses, errors and weights in
every epoch. Git therefore keeps the weights of only the runs the analyses read; any other run's
`model.pt` can be rebuilt where it was trained, and the rebuild proves itself by matching the
recorded `metrics.csv` in every epoch and column but the timings. Another processor's kernels
can differ in the last bits, which training then amplifies; about 1 fresh CPU process in 30
computes the supervised contrastive term in other last bits, so a replay that differs is worth
running once more (docs/training.md, "Replaying a run", says where both happened); and on a GPU
cuDNN's kernels are not bit-reproducible at all.
"""

import csv
from pathlib import Path

from infopro.device import resolve_device
from infopro.errors import InfoProError
from infopro.records import atomic_write, git_state, load_torch, processor, read_json, write_json
from infopro.runs import Run
from infopro.train import train

SHOWN_DIFFERENCES = 5  # per run; the count says how many more


class ReplayDiffers(InfoProError):
    """A replayed run whose record differs from the committed one."""

    exit_code = 1


def is_timing(column: str) -> bool:
    """Columns that measure wall-clock time (`epoch_seconds`, the module-parallel `busy_seconds_m*`) or
    read the clock (`ended_at`), which no replay can be expected to match."""
    return "seconds" in column or column == "ended_at"


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    """metrics.csv as text cells: a float is written as its shortest round-trip text, so equal
    text is equal value, bit for bit."""
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        return list(reader.fieldnames or []), list(reader)


def metrics_differences(recorded: Path, replayed: Path, *, so_far: bool = False) -> list[str]:
    """Where the replayed metrics.csv differs from the recorded one, in every column but the
    timings; empty when they agree in every epoch (`so_far`: in every epoch the replay has reached)."""
    recorded_columns, recorded_rows = read_rows(recorded)
    replayed_columns, replayed_rows = read_rows(replayed)
    columns = [c for c in recorded_columns if not is_timing(c)]
    if columns != [c for c in replayed_columns if not is_timing(c)]:
        return [f"metrics.csv columns: recorded {columns}, replayed "
                f"{[c for c in replayed_columns if not is_timing(c)]}"]
    differences = [f"epoch {old['epoch']} {column}: recorded {old[column]}, replayed {new[column]}"
                   for old, new in zip(recorded_rows, replayed_rows)
                   for column in columns if old[column] != new[column]]
    if len(recorded_rows) != len(replayed_rows) and not so_far:
        differences.append(f"metrics.csv epochs: recorded {len(recorded_rows)}, replayed {len(replayed_rows)}")
    return differences


def weights_differences(recorded: Path, replayed: Path) -> list[str]:
    """Tensors of the recorded model.pt that the replayed one does not hold bit for bit."""
    old = load_torch(recorded, "restore it from git")
    new = load_torch(replayed, "delete the replay's folder and run again")
    return [f"model.pt tensor {name} differs" for name in old
            if name not in new or not old[name].equal(new[name])]


def restore_weights(run: Run, replay: Path) -> None:
    """Copy the replay's weights into the run, with weights.json saying where they came from."""
    atomic_write(run.path / "model.pt", (replay / "model.pt").read_bytes())
    write_json(run.path / "weights.json", {
        "model.pt": "rebuilt by python -m experiments.retrain: a replay of this run from its config.json "
                    "whose metrics.csv equals the recorded one in every epoch and column but the timings",
        "replay_provenance": read_json(replay / "config.json")["provenance"],
        "restored_by": git_state(),
    })


def processor_label(part: dict) -> str:
    """A record's processor as a replay compares it: the name, and for a CPU the instruction set
    and generation that pick its kernels (records older than those fields say so)."""
    if part["device"] != "cpu":
        return part["device_name"]
    details = [part[key] for key in ("cpu_capability", "cpu_generation") if key in part]
    return f"{part['device_name']} ({', '.join(details) or 'instruction set and generation not recorded'})"


def recorded_processors(record: dict) -> set[str]:
    """The processors a run was trained on: the first call's and those of its resumptions."""
    return {processor_label(part) for part in [record["provenance"], *record.get("resumed", [])]}


def retrain(run: Run, work: Path, *, device: str | None = None, data_root=None, restore: bool = False,
            time_budget: float | None = None, log=print) -> list[str] | None:
    """Replay `run` into `work`/<run id> (resuming a replay already there); return its differences
    from the record (empty: identical), or None when `time_budget` (seconds) ran out first.

    The replay runs on the recorded device type unless `device` names another, and stops after
    the first epoch that differs from the record (hours saved where another processor's kernels
    part it in epoch 1). With `restore`, a run without weights gets the replay's once they agree;
    a run with weights has them compared tensor by tensor instead.
    """
    run.load_whole_data(data_root)  # a different copy of the data fails now, not after training
    device = resolve_device(device or run.record["provenance"]["device"],
                            remedy=f"{run.run_id} was trained on one: replay it on a GPU, or with --device cpu")
    recorded = recorded_processors(run.record)
    replaying = processor_label({"device": device.type, **processor(device)})
    if recorded != {replaying}:
        log(f"{run.run_id}: recorded on {'; '.join(sorted(recorded))}, replayed on {replaying}; "
            "kernels that differ between processors can change the last bits, and training amplifies them")
    replay = Path(work) / run.run_id
    recorded_metrics, replayed_metrics = run.path / "metrics.csv", replay / "metrics.csv"

    def parted() -> list[str]:
        """The replay's differences so far: once it has parted, no later epoch can bring it back."""
        if not replayed_metrics.exists():
            return []
        return metrics_differences(recorded_metrics, replayed_metrics, so_far=True)

    if not parted():  # a replay that parted in an earlier call is not continued
        # In the step mode the run was trained in: a compiled step sums in another order than an eager one.
        step_mode = run.record["provenance"].get("step_mode", "eager")
        summary = train(run.config, replay, device=str(device), data_root=data_root, resume=True,
                        time_budget=time_budget, stop_when=lambda epoch: bool(parted()), log=log, step_mode=step_mode)
        if summary is None and not parted():
            return None  # the time budget ran out
    differences = metrics_differences(recorded_metrics, replayed_metrics)
    if differences:
        return differences
    if run.has_weights:
        return weights_differences(run.path / "model.pt", replay / "model.pt")
    if restore:
        restore_weights(run, replay)
        log(f"{run.path / 'model.pt'}: restored from the replay")
    return []


def report(run: Run, differences: list[str], log=print) -> None:
    """One line per run (and its first differences): the outcome a user reads."""
    if not differences:
        log(f"{run.run_id}: the replay matches the record in every epoch")
        return
    log(f"{run.run_id}: the replay differs from the record in {len(differences)} place(s):")
    for line in differences[:SHOWN_DIFFERENCES]:
        log(f"  {line}")
    if len(differences) > SHOWN_DIFFERENCES:
        log(f"  ... and {len(differences) - SHOWN_DIFFERENCES} more")
