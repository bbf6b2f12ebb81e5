"""Seconds per training epoch of the paper's ResNet-32 recipe, per step mode and precision.

Table 3's step times say what one step costs; what GPU time buys is epochs. Each measurement
trains a few epochs of a grid configuration into a scratch run directory, in a fresh process
(`multiprocessing`'s spawn: no compiled graph, autotuning or allocator state carries over from
the one before), and reads their times back from metrics.csv. The first epoch pays for cuDNN's
autotuning and, in the compiled mode, for compilation; the epochs after it are the pace a
160-epoch run trains at. `compile_seconds` is what the first epoch took beyond that pace, in
either mode, so the compiled mode's cost is the difference of the two.
"""

import itertools
import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

from infopro.config import TrainConfig, method_name
from infopro.records import provenance, read_json
from infopro.runs import read_metrics
from infopro.train import train

# The configurations the grids train, cheapest to dearest: E2E, a local method, InfoPro's decoders at
# K = 4 and at K = 16, where the most of them run.
EPOCH_METHODS = (dict(regime="e2e", K=1), dict(regime="greedy", K=4),
                 dict(regime="infopro", task_loss="contrast", K=4), dict(regime="infopro", task_loss="contrast", K=16))
EPOCH_MODES = ("eager", "compiled")


def method_key(method: dict) -> tuple[str, int]:
    """(method, K) as the CSV names a configuration of `EPOCH_METHODS`: infopro-contrast, 4."""
    return method_name(method["regime"], method.get("task_loss")), method["K"]


def measure_epochs(config: TrainConfig, step_mode: str, device: str, data_root=None) -> dict:
    """Train `config` (its `epochs` epochs) in `step_mode` into a scratch directory; its epoch times."""
    with tempfile.TemporaryDirectory(prefix="infopro-epochs-") as folder:
        train(config, Path(folder) / "run", device=device, data_root=data_root, step_mode=step_mode,
              log=lambda line: None)
        seconds = read_metrics(Path(folder) / "run", ("epoch_seconds",))["epoch_seconds"]
        record = read_json(Path(folder) / "run" / "config.json")
    steady = float(seconds.iloc[1:].median())
    return {"epoch_seconds": steady, "images_per_second": record["dataset"]["train_size"] / steady,
            "first_epoch_seconds": float(seconds.iloc[0]),
            "compile_seconds": float(seconds.iloc[0]) - steady,
            "measured_epochs": len(seconds) - 1} | record["provenance"]


def in_fresh_process(function, *args):
    """`function(*args)` in a process of its own, started afresh (spawn), which ends with it."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def epoch_rows(recipe: TrainConfig, methods, modes, precisions, device, data_root=None, done=(), log=print):
    """One row per method, step mode and precision not in `done` (their (method, K, mode, precision)),
    each yielded as soon as it is measured, so that a caller can write it before the next one starts."""
    for method, precision, mode in itertools.product(methods, precisions, modes):
        key = (*method_key(method), mode, precision)
        if key in done:
            continue
        config = TrainConfig(**asdict(recipe) | method | {"precision": precision})
        row = dict(zip(("method", "K", "mode", "precision"), key)) | {"jobs": 1}
        label = f"{row['method']:<17} K={config.K:<3} {mode:<9} {precision}"
        try:
            row |= in_fresh_process(measure_epochs, config, mode, device, data_root)
        except Exception as failure:  # a mode that cannot train this configuration here: a finding, not a crash
            row |= failed_measurement(failure, device)
            log(f"{label}: failed, {row['error']}")
        else:
            log(f"{label}: {row['epoch_seconds']:.2f} s an epoch, first {row['first_epoch_seconds']:.1f} s")
        yield row


def failed_measurement(failure: Exception, device: str) -> dict:
    """The row of a measurement whose process failed (a graph the compiler refuses, memory it lacks): no
    times, the error's first line, and this process's provenance. Kept, so that the stage that asked for
    it is done and the grids never train in a mode that failed (`fastest_mode`)."""
    first_line = (str(failure).strip().splitlines() or [""])[0][:300]
    error = f"{type(failure).__name__}: {first_line}".rstrip(": ")
    return {"epoch_seconds": float("nan"), "error": error} | provenance(torch.device(device))


def short_recipe(recipe: TrainConfig, epochs: int) -> TrainConfig:
    """`recipe` cut to `epochs` epochs; the warm-up is cut with it, so the learning rate stays the recipe's
    kind of schedule (the time of an epoch does not depend on it)."""
    return replace(recipe, epochs=epochs, warmup_epochs=min(recipe.warmup_epochs, epochs - 1))
