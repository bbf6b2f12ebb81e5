"""Seconds per epoch of a remainder pass in each step mode, side by side: which mode the estimates use.

A network's sixteen remainders take about eight ResNet-32 trainings of the estimator's budget,
and on a GPU a pass may wait on the host issuing its small kernels rather than on the GPU
(`infopro.remainder`, the graphed step). Each mode trains every layer point of one network on
the same first `MEASURED_IMAGES` training images for two epochs, in one process, eager first:
the first epoch holds cuDNN's autotuning and the graphs' capture, the second is the pace. The
two modes must also agree on the loss of each epoch (`AGREEMENT`) before the faster one is used,
so that the estimates stay those of the eager step. A mode that fails keeps a row with its error
and is never used.
"""

import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from infopro.data import Split
from infopro.epoch_bench import failed_measurement
from infopro.records import provenance
from infopro.remainder import STEPS, RemainderSettings, step_graph, train_estimators

# 20 whole batches of 512 and a smaller last one, as every epoch of the 50,000 images ends (run eagerly
# beside the graphs): the second epoch's pace within seconds.
MEASURED_IMAGES = 10500
MEASURED_EPOCHS = 2
AGREEMENT = 0.02  # relative: the same kernels on the same numbers, up to cuDNN choosing other algorithms


def steps_csv(folder, slug: str) -> Path:
    """Where a GPU's measurement goes: <folder>/remainder-steps-<slug>.csv (`slug`: the device's, or * for any)."""
    return Path(folder) / f"remainder-steps-{slug}.csv"


def timed_epochs(backbone, train: Split, points: list[int], settings: RemainderSettings, graph) -> dict:
    """One mode's epochs over `train`: their wall-clock seconds and mean losses (the epoch's log line
    follows a `.item()`, which waits for the device)."""
    stamps = [time.perf_counter()]
    estimators = train_estimators(backbone, train, points, settings, lambda line: stamps.append(time.perf_counter()),
                                  graph)
    seconds = [after - before for before, after in zip(stamps, stamps[1:])]
    return {"seconds": seconds, "losses": estimators.epoch_losses}


def measure_steps(backbone, train: Split, points: list[int], settings=RemainderSettings(), steps=STEPS,
                  log=print) -> list[dict]:
    """One row per step mode: the pace of an epoch of the whole training set (`epoch_seconds`, scaled from
    the measured images), what the first epoch took beyond it, the loss of each epoch and whether it
    agrees with the eager step's. `backbone` must be frozen in eval mode."""
    subset = Split(train.images[:MEASURED_IMAGES], train.labels[:MEASURED_IMAGES])
    budget = replace(settings, epochs=MEASURED_EPOCHS, warmup_epochs=0)
    device = train.images.device
    graphs = {step: step_graph(step, device, settings.precision) for step in steps}  # refused before any work
    measured, rows = {}, []

    def row_of(step: str) -> dict:
        return {"step": step, "points": len(points), "measured_images": len(subset)} | settings.as_columns()

    for step, graph in graphs.items():
        try:
            measured[step] = timed_epochs(backbone, subset, points, budget, graph)
        except Exception as failure:  # a capture this GPU refuses: a finding; the passes then stay eager
            if graph is None:
                raise
            rows.append(row_of(step) | {"agrees_with_eager": False} | failed_measurement(failure, str(device)))
            log(f"{step}: failed, {rows[-1]['error']}")
        else:
            log(f"{step}: {measured[step]['seconds'][-1]:.2f} s for an epoch of {len(subset)} images")
    reference = measured.get("eager")
    for step, result in measured.items():
        pace = result["seconds"][-1]
        agrees = reference is None or all(abs(loss - eager) <= AGREEMENT * abs(eager)
                                          for loss, eager in zip(result["losses"], reference["losses"]))
        rows.append(row_of(step) | {"epoch_seconds": pace * len(train) / len(subset),
                                    "first_epoch_extra_seconds": result["seconds"][0] - pace,
                                    "loss_epoch1": result["losses"][0], "loss_epoch2": result["losses"][1],
                                    "agrees_with_eager": agrees} | provenance(device))
    return rows


def fastest_step(table: pd.DataFrame) -> str | None:
    """The step mode with the shortest epoch among those that agree with the eager step (None: none measured)."""
    agreeing = table[table["agrees_with_eager"].astype(str) == "True"]
    return None if agreeing.empty else str(agreeing.loc[agreeing["epoch_seconds"].idxmin(), "step"])
