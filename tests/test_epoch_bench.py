"""The epoch benchmark: rows per method and step mode, resumable, and the mode the grids train in."""

import time

import pandas as pd
import pytest

from conftest import run_main
from experiments import bench_epochs
from infopro import epoch_bench
from infopro.config import TrainConfig
from infopro.epoch_bench import EPOCH_METHODS, epoch_rows, method_key, short_recipe
from infopro.step import fastest_mode


def test_the_fastest_mode_sums_only_methods_every_mode_measured():
    table = pd.DataFrame([
        dict(method="e2e", K=1, mode="eager", precision="fp32", epoch_seconds=1.0),
        dict(method="e2e", K=1, mode="compiled", precision="fp32", epoch_seconds=0.6),
        dict(method="infopro-contrast", K=16, mode="eager", precision="fp32", epoch_seconds=3.4),  # eager alone
        dict(method="e2e", K=1, mode="eager", precision="bf16", epoch_seconds=0.1)])
    assert fastest_mode(table) == "compiled"
    assert fastest_mode(table[table["mode"] == "eager"]) is None
    table.loc[1, "epoch_seconds"] = 1.2
    assert fastest_mode(table) == "eager"


def test_the_fastest_mode_pays_for_compiling_once_per_run():
    """E2E's first epochs as measured on an H200, with a compiled pace a little faster than eager's: 0.09 s
    saved an epoch is 14 s over 160 epochs, less than the 20 s more that the compiled first epoch takes;
    over 400 epochs it is more."""
    table = pd.DataFrame([
        dict(method="e2e", K=1, mode="eager", precision="fp32", epoch_seconds=0.91, compile_seconds=9.6),
        dict(method="e2e", K=1, mode="compiled", precision="fp32", epoch_seconds=0.82, compile_seconds=29.2)])
    assert fastest_mode(table) == "eager"
    assert fastest_mode(table, epochs=400) == "compiled"
    assert fastest_mode(table.drop(columns="compile_seconds")) == "compiled"


def test_a_mode_that_failed_on_any_method_is_never_chosen():
    table = pd.DataFrame([
        dict(method="e2e", K=1, mode="eager", precision="fp32", epoch_seconds=1.0),
        dict(method="e2e", K=1, mode="compiled", precision="fp32", epoch_seconds=0.6),
        dict(method="infopro-contrast", K=16, mode="eager", precision="fp32", epoch_seconds=3.4),
        dict(method="infopro-contrast", K=16, mode="compiled", precision="fp32", epoch_seconds=float("nan"))])
    assert fastest_mode(table) == "eager"  # not None, which would leave the grids undecided


def test_a_measurement_whose_process_fails_is_a_row_with_its_error(monkeypatch):
    """A graph the compiler refuses on a GPU once would have ended the stage, and the grids would have
    trained compiled anyway (`auto`)."""
    def fresh_process(function, config, mode, *rest):
        if mode == "compiled":
            raise RuntimeError("inductor: no kernel for this graph\nand a long trace")
        return {"epoch_seconds": 2.0, "first_epoch_seconds": 3.0}
    monkeypatch.setattr(epoch_bench, "in_fresh_process", fresh_process)
    lines = []
    rows = list(epoch_rows(TrainConfig(), EPOCH_METHODS[:1], ["eager", "compiled"], ["fp32"], "cpu", log=lines.append))
    assert [row["mode"] for row in rows] == ["eager", "compiled"] and "error" not in rows[0]
    assert rows[1]["error"] == "RuntimeError: inductor: no kernel for this graph"
    assert pd.isna(rows[1]["epoch_seconds"]) and rows[1]["git_commit"] and "failed" in lines[1]
    assert fastest_mode(pd.DataFrame(rows)) == "eager"


def test_a_short_recipe_keeps_a_warm_up_shorter_than_itself():
    short = short_recipe(TrainConfig(), 3)
    assert (short.epochs, short.warmup_epochs, short.batch_size) == (3, 2, 1024)


@pytest.mark.slow
def test_each_row_times_the_epochs_after_the_first_in_a_fresh_process():
    recipe = short_recipe(TrainConfig(dataset="synthetic", train_subset=128, test_subset=32, batch_size=64), 3)
    rows = list(epoch_rows(recipe, EPOCH_METHODS[:1], ["eager"], ["fp32"], "cpu", log=lambda line: None))
    (row,) = rows
    assert (row["method"], row["K"], row["mode"], row["precision"], row["jobs"]) == ("e2e", 1, "eager", "fp32", 1)
    assert row["measured_epochs"] == 2 and row["step_mode"] == "eager"
    assert row["images_per_second"] == pytest.approx(128 / row["epoch_seconds"])
    assert row["compile_seconds"] == pytest.approx(row["first_epoch_seconds"] - row["epoch_seconds"])


def test_a_complete_file_is_continued_without_measuring_again(tmp_path):
    rows = [dict(method=method_key(method)[0], K=method_key(method)[1], mode=mode, precision="fp32",
                 epoch_seconds=1.0) for method in EPOCH_METHODS for mode in ("eager", "compiled")]
    pd.DataFrame(rows).to_csv(tmp_path / "epoch-resnet32-cpu.csv", index=False)
    result = run_main("experiments.bench_epochs", "--dataset", "synthetic", "--device", "cpu", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert pd.read_csv(tmp_path / "epoch-resnet32-cpu.csv").equals(pd.DataFrame(rows))


def test_no_measurement_starts_after_the_time_budget_and_the_next_call_goes_on(monkeypatch, tmp_path):
    def fresh_process(function, config, mode, *rest):
        time.sleep(0.05)
        return {"epoch_seconds": 1.0, "first_epoch_seconds": 2.0}
    monkeypatch.setattr(epoch_bench, "in_fresh_process", fresh_process)
    args = ["--dataset", "synthetic", "--device", "cpu", "--out", str(tmp_path), "--time-budget", "0.0005"]
    bench_epochs.main(args)  # 0.03 s: one measurement, then none started
    path = tmp_path / "epoch-resnet32-cpu.csv"
    assert len(pd.read_csv(path)) == 1
    bench_epochs.main(args)
    assert pd.read_csv(path)[["method", "mode"]].values.tolist() == [["e2e", "eager"], ["e2e", "compiled"]]


def test_missing_data_is_one_line_before_any_measurement(tmp_path):
    result = run_main("experiments.bench_epochs", "--dataset", "cifar10-jpeg", "--data-root", str(tmp_path / "none"),
                      "--device", "cpu", "--out", str(tmp_path))
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "epoch-resnet32-cpu.csv").exists()
