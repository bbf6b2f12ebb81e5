"""Per-image test predictions of finished runs, and paired comparisons of two methods on them.

Why: a run's recorded test error is measured on its test subset (2,000 images in the CPU
fixture), and its binomial error (about 1 point) is as large as the differences between
methods; more seeds do not shrink it, since every seed is scored on the same images. Two
things do. (1) The test images a run never used, neither in training nor in its recorded
error (the 8,000 outside a 2,000-image subset), form a fresh test set on which a
difference seen in the recorded errors can be checked. (2) Two networks scored on the same
images are compared image by image: only the images on which one is right and the other
wrong say which is better (McNemar's test), so the standard error of the difference is
set by how often they disagree, not by how often they err.
"""

import math
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from infopro.analysis import analysis_code, analysis_device
from infopro.data import subset_indices
from infopro.records import check_writable, decode_correct, encode_correct, read_table, update_csv
from infopro.runs import Run
from infopro.step import predict

# A comparison pairs runs that differ only in their method: same data, recipe, K and seed.
PAIRING_KEY = ["dataset", "arch", "K", "split", "seed", "recipe", "precision", "test_split_images"]


def pairing_key(reference: str) -> list[str]:
    """What a run must share with its reference run: E2E has no modules (K = 1, no split), so
    each locally supervised run is set beside the E2E run of its data, recipe and seed."""
    return [key for key in PAIRING_KEY if key not in ("K", "split")] if reference == "e2e" else PAIRING_KEY


def used_images(size: int, test_subset: int | None) -> np.ndarray:
    """Which images of a test split of `size` a run with `test_subset` was scored on (all when None)."""
    if not test_subset or test_subset >= size:
        return np.ones(size, dtype=bool)
    used = np.zeros(size, dtype=bool)
    used[subset_indices(size, test_subset).numpy()] = True
    return used


def read_predictions(path) -> pd.DataFrame:
    """test_predictions.csv as written: `correct` stays text even where its hex has no letter."""
    return read_table(path, "restore it from git, or delete it and make it again with `make test-predictions`",
                      ("run_id", "correct"), dtype={"correct": str})


def error(correct: np.ndarray) -> float:
    """Error (%) computed as the trainer's `evaluate` computes it, so a re-score can equal it exactly."""
    return 100.0 * np.count_nonzero(~correct) / len(correct) if len(correct) else math.nan


def prediction_row(run: Run, device: torch.device, data_root=None) -> dict:
    """The run's network scored on every image of its dataset's test split.

    `own_test_error` re-scores the images its recorded error was measured on, so a row also
    checks that the committed weights are the network the run reported; `held_out_test_error`
    scores the rest.
    """
    test = run.load_whole_data(data_root).test.to(device)
    correct = (predict(run.load_net(device), test, run.config.precision) == test.labels).cpu().numpy()
    return scored_row(run, correct, used_images(len(test), run.config.test_subset), "model.pt", device)


def has_recorded_predictions(run: Run) -> bool:
    """Whether the run's training recorded right/wrong for every image of its dataset's test split."""
    return "final_test_correct" in run.summary and not run.config.test_subset


def recorded_row(run: Run, device: torch.device) -> dict:
    """The row `prediction_row` would give, from the per-image results the run's training recorded.

    Why: git keeps the weights of seed 0 only, so the other seeds of a grid could not be compared
    image by image otherwise. The record is the final network scored where it was trained (a
    GPU's TF32 convolutions may move an image or two that a CPU re-score would not); it covers
    the run's own test images, so only runs on the whole split have one for every image.
    """
    correct = decode_correct(run.summary["final_test_correct"], run.record["dataset"]["test_size"])
    return scored_row(run, correct, np.ones(len(correct), dtype=bool), "summary.json", device)


def scored_row(run: Run, correct: np.ndarray, used: np.ndarray, scored_from: str, device: torch.device) -> dict:
    """test_predictions.csv's row of a run right or wrong on each test image (`used`: its own ones)."""
    return run.row() | {
        "test_split_images": len(correct), "held_out_images": int((~used).sum()),
        "recorded_test_error": run.summary["final_test_error"], "own_test_error": error(correct[used]),
        "held_out_test_error": error(correct[~used]), "correct": encode_correct(correct), "scored_from": scored_from,
    } | analysis_device(device)


def predict_runs(runs: list[Run], csv_path, device: torch.device, data_root=None, *, force: bool = False,
                 log=print) -> pd.DataFrame:
    """Add a row per run not yet in the CSV (all of them with `force`): its network scored where it has
    weights, else its training's per-image record where that covers the whole test split. The CSV is
    rewritten atomically after each, so an interrupted call loses nothing and a re-run does what is left."""
    csv_path, code = Path(csv_path), analysis_code()
    check_writable(csv_path.parent)
    table = read_predictions(csv_path) if csv_path.exists() else pd.DataFrame(columns=["run_id"])
    for run in runs:
        if not run.has_weights and not has_recorded_predictions(run):
            log(f"{run.run_id}: no model.pt, skipped")
        elif run.run_id in set(table["run_id"]) and not force:
            log(f"{run.run_id}: already scored")
        else:
            scored = (prediction_row(run, device, data_root) if run.has_weights else recorded_row(run, device)) | code
            log(scored_line(scored))
            table = update_csv(csv_path, read_predictions, partial(replace_run, row=scored))
    return table


def scored_line(row: dict) -> str:
    own = f"{row['run_id']}: {row['own_test_error']:.2f}% on its {row['test_images']:,} test images"
    if row["scored_from"] == "summary.json":
        return own + ", as its training recorded them (no model.pt)"
    own += f" (recorded {row['recorded_test_error']:.2f}%)"
    if not row["held_out_images"]:
        return own + ", none held out (the run tested on its whole split)"
    return own + f", {row['held_out_test_error']:.2f}% on {row['held_out_images']:,} held out"


def replace_run(table: pd.DataFrame, row: dict) -> pd.DataFrame:
    """`table` with `row` in place of its run's row."""
    others = table[table["run_id"] != row["run_id"]] if "run_id" in table else table
    return pd.concat([others, pd.DataFrame([row])], ignore_index=True)


def paired_difference(correct_a: np.ndarray, correct_b: np.ndarray) -> dict:
    """How far B's error is below A's on the same images, with its paired standard error and
    McNemar's exact two-sided p-value (a binomial test on the images exactly one gets right)."""
    from scipy.stats import binomtest  # 1 s to import, which every figure's process would pay for the tables' test
    only_a, only_b = int(np.sum(correct_a & ~correct_b)), int(np.sum(~correct_a & correct_b))
    n, discordant = len(correct_a), only_a + only_b
    return {
        "images": n, "error_a": error(correct_a), "error_b": error(correct_b),
        "lead": 100.0 * (only_b - only_a) / n,
        "paired_se": 100.0 * math.sqrt(discordant - (only_b - only_a) ** 2 / n) / n,
        "only_a_right": only_a, "only_b_right": only_b,
        "mcnemar_p": binomtest(only_b, discordant).pvalue if discordant else 1.0,
    }


def paired_comparisons(predictions: pd.DataFrame, reference: str = "greedy") -> pd.DataFrame:
    """Every run beside the `reference` regime's run with the same `pairing_key`, on the test
    images neither used (all of them when the runs scored the whole split).

    One row per pair: the other run's description, both recorded errors and `paired_difference`
    with A = the reference, so `lead` > 0 means the other method errs less.
    """
    is_reference = predictions["regime"] == reference
    return pd.DataFrame(paired_rows(predictions[is_reference], predictions[~is_reference], pairing_key(reference)))


def ordered_comparisons(predictions: pd.DataFrame, order: tuple[str, ...]) -> pd.DataFrame:
    """Each run beside the run ranked next after it in `order` (best first, values of a `method`
    column the caller adds) among those present with the same `PAIRING_KEY`: the steps of a claimed
    ranking, such as the paper's InfoPro (Contrast) < InfoPro (Softmax) < DGL < greedy SL.

    Rows as `paired_comparisons`'s, A being the next run (`reference_method`), so `lead` > 0 means
    the step holds on those images. Where a method has no run, its neighbours meet."""
    rows = []
    for _, runs in predictions[predictions["method"].isin(order)].groupby(PAIRING_KEY, dropna=False):
        present = [method for method in order if method in set(runs["method"])]
        for better, next_one in zip(present, present[1:]):
            rows += [row | {"reference_method": next_one} for row in paired_rows(
                runs[runs["method"] == next_one], runs[runs["method"] == better], PAIRING_KEY)]
    return pd.DataFrame(rows)


def paired_rows(references: pd.DataFrame, others: pd.DataFrame, key: list[str]) -> list[dict]:
    """A `paired_comparisons` row for each run of `others` and each run of `references` with the
    same `key` values."""
    rows = []
    for _, run in others.iterrows():
        same = (references[key] == run[key]).all(axis=1)
        for _, ref in references[same].iterrows():
            size = int(run["test_split_images"])
            kept = ~used_images(size, int(run["test_images"])) if run["held_out_images"] else np.ones(size, bool)
            rows.append(run.drop("correct").to_dict() | {
                "reference_run_id": ref["run_id"], "reference_recorded_test_error": ref["recorded_test_error"],
                "compared_on": "held-out" if run["held_out_images"] else "all",
            } | paired_difference(decode_correct(ref["correct"], size)[kept],
                                  decode_correct(run["correct"], size)[kept]))
    return rows
