"""Per-image test predictions and paired comparisons: exact on constructed cases, and end to end."""

import math

import numpy as np
import pandas as pd
import pytest

import torch

from conftest import run_main
from infopro import tables
from infopro.config import TrainConfig
from infopro.data import Split
from infopro.errors import InfoProError
from infopro.paired import (ordered_comparisons, paired_comparisons, paired_difference, predict_runs, read_predictions,
                            used_images)
from infopro.records import decode_correct, encode_correct
from infopro.runs import find_runs
from infopro.selection import PAPER_RANKING, with_method
from infopro.train import train

TINY = TrainConfig(regime="greedy", K=2, dataset="synthetic", train_subset=192, test_subset=64,
                   epochs=1, batch_size=64, lr=0.05, warmup_epochs=1)


def quiet(line):
    pass


def test_right_and_wrong_survive_encoding_for_any_length():
    rng = np.random.default_rng(0)
    for n in (1, 7, 8, 9, 10_000):
        correct = rng.random(n) < 0.7
        assert np.array_equal(decode_correct(encode_correct(correct), n), correct)
    assert len(encode_correct(np.ones(10_000, bool))) == 2_500


def test_predictions_whose_hex_has_no_letter_read_back_as_written(tmp_path):
    correct = np.unpackbits(np.array([0x01, 0x23], dtype=np.uint8)).astype(bool)
    assert encode_correct(correct) == "0123"
    pd.DataFrame({"run_id": ["r"], "correct": ["0123"]}).to_csv(tmp_path / "p.csv", index=False)
    assert np.array_equal(decode_correct(read_predictions(tmp_path / "p.csv")["correct"][0], 16), correct)


def test_used_images_are_those_of_the_subset_a_run_is_scored_on():
    split = Split(torch.zeros(100, 3, 32, 32, dtype=torch.uint8), torch.arange(100))
    used = used_images(100, 30)
    assert used.sum() == 30
    assert set(np.flatnonzero(used)) == set(split.subset(30).labels.tolist())
    assert used_images(100, None).all() and used_images(100, 100).all()


def test_paired_difference_against_its_definitions():
    rng = np.random.default_rng(1)
    a = rng.random(5_000) < 0.7
    b = np.where(rng.random(5_000) < 0.8, a, rng.random(5_000) < 0.8)  # mostly agrees with a
    result = paired_difference(a, b)
    assert result["lead"] == pytest.approx(result["error_a"] - result["error_b"])
    per_image = b.astype(float) - a.astype(float)  # +1 where only b is right, −1 where only a is
    assert result["paired_se"] == pytest.approx(100 * per_image.std() / math.sqrt(len(a)))
    assert result["only_a_right"] + result["only_b_right"] == np.sum(a != b)


def test_mcnemar_p_is_one_for_a_tie_and_small_for_a_one_sided_disagreement():
    a = np.array([True] * 10 + [False] * 10 + [True] * 80)
    b = np.array([False] * 10 + [True] * 10 + [True] * 80)
    tie = paired_difference(a, b)
    assert (tie["lead"], tie["mcnemar_p"]) == (0.0, 1.0)
    one_sided = paired_difference(np.zeros(100, bool), np.r_[np.ones(12, bool), np.zeros(88, bool)])
    assert one_sided["lead"] == 12.0 and one_sided["mcnemar_p"] == pytest.approx(2 * 0.5 ** 12)
    same = paired_difference(a, a)
    assert (same["lead"], same["paired_se"], same["mcnemar_p"]) == (0.0, 0.0, 1.0)


def scored_on_whole_split(rng, regime, seed, K=2, split="paper", recipe="r"):
    """A test_predictions.csv row of a run scored on all 50 images of its split, right at random."""
    return {"run_id": f"{regime}-K{K}-s{seed}-{recipe}", "regime": regime,
            "task_loss": "contrast" if regime == "infopro" else None, "dataset": "synthetic",
            "arch": "resnet32", "K": K, "split": split, "seed": seed, "recipe": recipe, "precision": "fp32",
            "train_images": 100, "epochs": 1, "test_split_images": 50, "test_images": 50, "held_out_images": 0,
            "recorded_test_error": 0.0, "own_test_error": 0.0, "run_device": "a CPU",
            "correct": encode_correct(rng.random(50) < 0.5)}


def test_runs_on_the_whole_split_pair_on_all_of_it_and_only_with_their_own_seed():
    rng = np.random.default_rng(2)
    pairs = paired_comparisons(pd.DataFrame([scored_on_whole_split(rng, "greedy", 0),
                                             scored_on_whole_split(rng, "infopro", 0),
                                             scored_on_whole_split(rng, "infopro", 1)]))
    assert len(pairs) == 1
    assert pairs.iloc[0][["run_id", "reference_run_id", "compared_on", "images"]].tolist() == [
        "infopro-K2-s0-r", "greedy-K2-s0-r", "all", 50]


def test_e2e_is_the_reference_of_every_k_of_its_own_recipe_and_seed():
    rng = np.random.default_rng(3)
    runs = pd.DataFrame([scored_on_whole_split(rng, "e2e", 0, K=1, split="none"),
                         scored_on_whole_split(rng, "greedy", 0, K=2), scored_on_whole_split(rng, "infopro", 0, K=4),
                         scored_on_whole_split(rng, "infopro", 1, K=4),
                         scored_on_whole_split(rng, "greedy", 0, K=2, recipe="longer")])
    pairs = paired_comparisons(runs, reference="e2e")
    assert sorted(pairs["run_id"]) == ["greedy-K2-s0-r", "infopro-K4-s0-r"]
    assert set(pairs["reference_run_id"]) == {"e2e-K1-s0-r"}

    table, caption = tables.e2e_gap(runs)
    assert table[["method", "K"]].values.tolist() == [["Greedy SL", 2], ["InfoPro (Contrast)", 4]]
    assert "E2E: error (%)" in table and "lead = E2E's error − the method's" in caption
    assert "Each of the 5 scored networks re-scores its recorded error exactly." in caption
    runs.loc[0, ["recorded_test_error", "run_device"]] = [0.04, "a GPU"]
    assert ("4 of the 5 scored networks re-score their recorded error exactly, the other 1 (trained on a GPU) "
            "to within 0.04 points.") in tables.e2e_gap(runs)[1]
    assert "greedy SL and InfoPro against E2E" in caption
    with pytest.raises(InfoProError, match="no locally supervised run has an E2E run"):
        tables.e2e_gap(runs[runs["regime"] != "e2e"])


def test_dgl_is_paired_with_e2e_but_not_in_the_comparison_of_infopro_with_greedy_sl():
    rng = np.random.default_rng(4)
    runs = pd.DataFrame([scored_on_whole_split(rng, "e2e", 0, K=1, split="none"),
                         scored_on_whole_split(rng, "greedy", 0), scored_on_whole_split(rng, "dgl", 0),
                         scored_on_whole_split(rng, "infopro", 0)])
    gap, caption = tables.e2e_gap(runs)
    assert gap["method"].tolist() == ["Greedy SL", "DGL", "InfoPro (Contrast)"]
    assert "greedy SL, DGL and InfoPro against E2E" in caption
    assert tables.paired(runs)[0]["method"].tolist() == ["InfoPro (Contrast)"]


def test_each_step_of_the_papers_ranking_pairs_a_run_with_the_next_method_present():
    """Contrast beside Softmax, Softmax beside greedy SL where DGL has no run, Contrast beside greedy SL
    where Softmax has none; E2E and another recipe stay out; lead > 0 where the paper's step holds."""
    rng = np.random.default_rng(5)
    runs = [scored_on_whole_split(rng, "e2e", 0, K=1, split="none"), scored_on_whole_split(rng, "greedy", 0),
            scored_on_whole_split(rng, "infopro", 0) | {"correct": encode_correct(np.arange(50) < 45)},
            scored_on_whole_split(rng, "infopro", 0) | {"run_id": "softmax-K2-s0-r", "task_loss": "softmax",
                                                        "correct": encode_correct(np.arange(50) < 40)},
            scored_on_whole_split(rng, "greedy", 1), scored_on_whole_split(rng, "infopro", 1),
            scored_on_whole_split(rng, "dgl", 0, recipe="longer")]
    pairs = ordered_comparisons(with_method(pd.DataFrame(runs)), PAPER_RANKING)
    assert pairs[["run_id", "reference_run_id", "reference_method"]].values.tolist() == [
        ["infopro-K2-s0-r", "softmax-K2-s0-r", "infopro-softmax"], ["softmax-K2-s0-r", "greedy-K2-s0-r", "greedy"],
        ["infopro-K2-s1-r", "greedy-K2-s1-r", "greedy"]]
    assert pairs.iloc[0]["lead"] == pytest.approx(10.0)  # Contrast errs on 5 images, Softmax on 10

    table, caption = tables.ranking(pd.DataFrame(runs))
    assert table[["method", "next", "seed"]].values.tolist() == [
        ["InfoPro (Contrast)", "InfoPro (Softmax)", 0], ["InfoPro (Softmax)", "Greedy SL", 0],
        ["InfoPro (Contrast)", "Greedy SL", 1]]
    assert "reference_method" not in table and "positive where the paper's step holds" in caption
    with pytest.raises(InfoProError, match="no two methods of the paper's ranking"):
        tables.ranking(pd.DataFrame(runs[:2]))


@pytest.mark.slow
def test_scored_runs_reproduce_their_recorded_error_and_pair_on_the_held_out_images(tmp_path):
    train(TINY, tmp_path / "runs" / "greedy", device="cpu", log=quiet)
    infopro = TrainConfig(**{**TINY.__dict__, "regime": "infopro", "task_loss": "softmax"})
    train(infopro, tmp_path / "runs" / "infopro", device="cpu", log=quiet)
    csv, lines = tmp_path / "test_predictions.csv", []
    table = predict_runs(find_runs(tmp_path / "runs"), csv, torch.device("cpu"), log=lines.append)
    assert list(table["own_test_error"]) == list(table["recorded_test_error"])
    assert list(table["held_out_images"]) == [1000 - 64] * 2

    predict_runs(find_runs(tmp_path / "runs"), csv, torch.device("cpu"), log=lines.append)
    assert sum("already scored" in line for line in lines) == 2
    (tmp_path / "a-file").write_text("")
    with pytest.raises(InfoProError, match="cannot write results in .*a-file"):  # before any network is scored
        predict_runs(find_runs(tmp_path / "runs"), tmp_path / "a-file" / "out.csv", torch.device("cpu"),
                     log=lines.append)
    assert len(lines) == 4

    pairs = paired_comparisons(read_predictions(csv))
    assert len(pairs) == 1
    pair, greedy = pairs.iloc[0], table[table["regime"] == "greedy"].iloc[0]
    assert pair["regime"] == "infopro" and pair["compared_on"] == "held-out" and pair["images"] == 936
    assert pair["error_a"] == pytest.approx(greedy["held_out_test_error"])
    assert pair["lead"] == pytest.approx(pair["error_a"] - pair["held_out_test_error"])

    table, caption = tables.paired(read_predictions(csv))
    assert table.iloc[0][["K", "epochs", "seed", "images"]].astype(str).tolist() == ["2", "1", "0", "936"]
    assert "re-scores its recorded error exactly" in caption


@pytest.mark.slow
def test_runs_without_weights_are_compared_from_what_their_training_recorded(tmp_path):
    whole = {**TINY.__dict__, "test_subset": None}
    train(TrainConfig(**whole), tmp_path / "runs" / "greedy", device="cpu", log=quiet)
    train(TrainConfig(**{**whole, "regime": "infopro", "task_loss": "softmax"}), tmp_path / "runs" / "infopro",
          device="cpu", log=quiet)
    train(TrainConfig(**{**TINY.__dict__, "seed": 1}), tmp_path / "runs" / "subset", device="cpu", log=quiet)
    lines = []
    scored = predict_runs(find_runs(tmp_path / "runs"), tmp_path / "scored.csv", torch.device("cpu"),
                          log=lines.append)
    assert sum(line.endswith("none held out (the run tested on its whole split)") for line in lines) == 2
    for run in ("greedy", "infopro", "subset"):
        (tmp_path / "runs" / run / "model.pt").unlink()
    lines = []
    recorded = predict_runs(find_runs(tmp_path / "runs"), tmp_path / "recorded.csv", torch.device("cpu"),
                            log=lines.append)

    subset_run = scored.loc[scored["held_out_images"] > 0, "run_id"].item()  # its record covers 64 of 1,000 images
    assert [line for line in lines if "skipped" in line] == [f"{subset_run}: no model.pt, skipped"]
    assert list(recorded["scored_from"]) == ["summary.json"] * 2
    assert list(recorded["own_test_error"]) == list(recorded["recorded_test_error"])
    rescored = scored.set_index("run_id").loc[recorded["run_id"]]
    assert list(recorded["correct"]) == list(rescored["correct"]) and set(rescored["scored_from"]) == {"model.pt"}
    table, caption = tables.paired(read_predictions(tmp_path / "recorded.csv"))
    assert table.iloc[0]["images"] == 1000 and "re-score" not in caption
    assert "2 more, whose weights git does not keep, are taken as their training recorded them" in caption
    rescored = read_predictions(tmp_path / "scored.csv")
    assert table.equals(tables.paired(rescored[rescored["run_id"].isin(recorded["run_id"])])[0])


def test_one_network_taken_from_its_record_reads_in_the_singular():
    one = pd.DataFrame({"run_device": ["NVIDIA H100 80GB HBM3"]})
    assert tables.taken_from_record(one) == ("1 more, whose weights git does not keep, is taken as its training "
                                             "recorded it (right or wrong per image, on NVIDIA H100 80GB HBM3).")


def test_an_unmatched_selection_gets_one_line_and_exit_2():
    result = run_main("analysis.score_test_images", "--runs", "results", "--only", "nothing")
    assert result.returncode == 2 and result.stderr.strip() == "error: no finished run matches nothing"
