"""Figures, tables and notebooks build from results/ alone; missing or damaged inputs get one line."""

import json
import re
import shutil
import subprocess

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection

from conftest import REPO, run_main, unfinished_copy
from infopro.config import method_name
from infopro.errors import InfoProError
from infopro.figures import (FIGURES, TABLES, TARGETS, RowPicker, build, load_reference, load_runs,
                             load_schedule_analysis, max_batch_path, memory_figure, recipe_rows, table3, table3_bench)
from infopro.layer_plots import fig8_linear_probes, fig_information_plane, layer_table
from infopro.local import TASK_LOSSES, regimes
from infopro.plots import fig_training_curves, off_scale_top
from infopro.records import read_json
from infopro.runs import find_runs, schedule_pairs, training_curves
from infopro.selection import figure_rows, main_recipe, remeasured_times, seeds_at_every_point, with_method
from infopro.style import METHODS
from infopro.tables import extra_work, mean_std, schedule_check, table2, to_latex

RESULTS = REPO / "results"


def results_before_the_profile(tmp_path):
    """The committed results without model weights and without the GPU's re-measured and compiled step
    times, profile and idle analysis, which the tests below replace by stand-ins: what a lease commits of
    those must not decide what the tests expect."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.pt", "logs", "remeasured", "profile-*",
                                                                    "idle-*", "compiled"))
    return results


def test_every_method_the_trainer_can_name_has_a_style():
    """A local loss added to `local.OBJECTIVES` needs a label, colour and marker before a figure can draw it."""
    names = {method_name(regime, task) for regime in regimes() for task in TASK_LOSSES}
    assert names <= set(METHODS), f"no style.METHODS entry for {sorted(names - set(METHODS))}"


def test_table3_shows_the_max_batch_search_and_the_work_and_ignores_other_bench_csvs(tmp_path):
    """Stand-in CSVs of the other measurements in bench/ (their real ones come from a GPU, or from
    another batch size: the work counted at a batch other than the step table's is not its)."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.pt", "logs"))
    pd.DataFrame({"jobs": [1, 2], "images_per_second": [1.0, 2.0], "best": [False, True]}).to_csv(
        results / "bench" / "grid-jobs-table2-resnet32-cpu.csv", index=False)
    pd.DataFrame({"method": ["e2e", "e2e", "checkpoint", "offload"], "cap_gib": [2.0, 4.0, 2.0, 2.0],
                  "max_batch": [200, 410, 900, None], "error": [None, None, None, "not searched"]}).to_csv(
        max_batch_path(results, table3_bench(results)), index=False)  # the search of the step table's device
    bench = table3_bench(results)
    for batch, checkpoint in ((bench["batch_size"].iloc[0], 1.25), (8, 2.0)):
        pd.DataFrame({"method": ["e2e", "checkpoint"], "step_flops_vs_e2e": [1.0, checkpoint],
                      "step_operators_vs_e2e": [1.0, 1.5], "device": "cpu"}).to_csv(
            results / "bench" / f"work-{bench['arch'].iloc[0]}-b{batch}.csv", index=False)
    build("fig_memory", results)
    build("table3", results)
    table = pd.read_csv(results / "tables" / "table3.csv", dtype=str).set_index("method")
    assert list(table.loc["e2e", ["ours: max batch in 2 GiB", "ours: max batch in 4 GiB"]]) == ["200", "410"]
    assert table.loc["checkpoint", "ours: max batch in 4 GiB"] == "–"
    assert table.loc["offload", "ours: max batch in 2 GiB"] == "–"
    assert list(table.loc[["e2e", "checkpoint", "offload"], "ours: FLOPs vs E2E"]) == ["+0.0%", "+25.0%", "–"]
    assert table.loc["checkpoint", "ours: operators vs E2E"] == "+50.0%"
    assert table.loc["checkpoint", "paper: theoretical"] == "+32.8%"  # results/reference/table3.csv


def test_table3_takes_re_measured_times_against_their_own_e2e_and_the_profiled_busy_time(tmp_path):
    """Stand-in CSVs: a later call timed E2E and checkpointing again (E2E slower in it, so a ratio
    against the first call's E2E would differ), and a profile of two methods, each operator's share
    being of all its method's operators."""
    results = results_before_the_profile(tmp_path)
    bench = table3_bench(results).set_index("method")
    name = bench["source_file"].iloc[0]
    later = bench.loc[["e2e", "checkpoint"]].reset_index().assign(
        step_seconds=[2.0, 3.0], step_seconds_vs_e2e=[1.0, 1.5], git_commit="f" * 40)
    (results / "bench" / "remeasured").mkdir(exist_ok=True)
    later.to_csv(results / "bench" / "remeasured" / name, index=False)
    pd.DataFrame({"method": ["e2e", "e2e", "checkpoint"], "operator": ["conv", "add", "conv"],
                  "self_ms_per_step": [3.0, 1.0, 5.0], "share": [0.75, 0.25, 1.0], "steps": 5,
                  "git_commit": "e" * 40}).to_csv(results / "bench" / f"profile-{name}", index=False)
    table, caption = table3(results)
    table = table.set_index("method")
    assert list(table.loc[["e2e", "checkpoint"], "ours: time vs E2E"]) == ["+0.0%", "+50.0%"]
    untouched = bench.loc["greedy:4", "step_seconds_vs_e2e"]
    assert table.loc["greedy:4", "ours: time vs E2E"] == f"{100 * (untouched - 1):+.1f}%"
    assert list(table.loc[["e2e", "checkpoint", "greedy:4"], "ours: busy time vs E2E"]) == ["+0.0%", "+25.0%", "–"]
    assert "Step times of e2e, checkpoint re-measured at fffffff" in caption and "at eeeeeee" in caption
    footer = re.sub(r"\s", "", memory_figure(results).texts[-1].get_text())  # wrapped at spaces and hyphens
    assert "steptimesofe2e,checkpointre-measuredatfffffff" in footer
    later.drop(index=0).to_csv(results / "bench" / "remeasured" / name, index=False)
    with pytest.raises(InfoProError, match="holds no E2E step"):
        table3(results)


def test_table3_sets_compiled_step_times_against_their_own_e2e_beside_the_eager_ones(tmp_path):
    """A stand-in compiled table: E2E and InfoPro* K = 4 timed (E2E faster than in the eager table, so a
    ratio against the eager E2E would differ), checkpointing refused; no E2E in it is refused."""
    results = results_before_the_profile(tmp_path)
    bench = table3_bench(results).set_index("method")
    name = bench["source_file"].iloc[0]
    assert "ours: time vs E2E, compiled" not in table3(results)[0]
    compiled = bench.loc[["e2e", "infopro-balanced:4"]].reset_index().assign(
        step_mode="compiled", step_seconds=[0.5, 0.6], step_seconds_vs_e2e=[1.0, 1.2], git_commit="c" * 40)
    refused = bench.loc[["checkpoint"], ["arch", "device", "batch_size", "precision"]].reset_index()
    (results / "bench" / "compiled").mkdir()
    pd.concat([compiled, refused.assign(error="checkpoint steps eagerly only")]).to_csv(
        results / "bench" / "compiled" / name, index=False)
    table, caption = table3(results)
    table = table.set_index("method")
    assert list(table.loc[["e2e", "infopro-balanced:4", "checkpoint"], "ours: time vs E2E, compiled"]) == \
        ["+0.0%", "+20.0%", "–"]
    eager = bench.loc["infopro-balanced:4", "step_seconds_vs_e2e"]
    assert table.loc["infopro-balanced:4", "ours: time vs E2E"] == f"{100 * (eager - 1):+.1f}%"  # untouched
    assert "compiled E2E" in caption and "at ccccccc" in caption
    compiled.drop(index=0).to_csv(results / "bench" / "compiled" / name, index=False)
    with pytest.raises(InfoProError, match="holds no E2E step"):
        table3(results)


def test_table3_shows_the_gpus_idle_time_where_the_trace_was_read(tmp_path):
    """A stand-in idle CSV of two methods: each gets its idle time and, in brackets, its dispatch
    share; a method not profiled gets a dash, and the caption names the commit."""
    results = results_before_the_profile(tmp_path)
    name = table3_bench(results)["source_file"].iloc[0]
    _, caption = table3(results)
    assert "GPU idle" not in caption
    pd.DataFrame({"method": ["e2e", "checkpoint"], "idle_ms_per_step": [2.5, 19.5],
                  "idle_dispatch_ms_per_step": [0.3, 17.0], "git_commit": "d" * 40}).to_csv(
        results / "bench" / f"idle-{name}", index=False)
    table, caption = table3(results)
    idle = table.set_index("method")["ours: GPU idle (ms/step)"]
    assert list(idle[["e2e", "checkpoint", "greedy:4"]]) == ["2.5 (0.3)", "19.5 (17.0)", "–"]
    assert "waiting for the host's dispatch" in caption and "at ddddddd" in caption


def test_benchmark_csvs_with_failed_methods_still_build_table3(tmp_path):
    """A method that failed in a later call leaves a row holding only its error: the re-measurement
    keeps its other methods' times (the failed one keeps the full table's), the idle column shows it
    as not read, and a profile whose every method failed is as if none had been made."""
    results = results_before_the_profile(tmp_path)
    bench = table3_bench(results).set_index("method")
    name = bench["source_file"].iloc[0]
    later = bench.loc[["e2e", "checkpoint"]].reset_index().assign(step_seconds=2.0, step_seconds_vs_e2e=1.0,
                                                                    git_commit="f" * 40)
    failed = bench.loc[["greedy:4"], ["arch", "device", "batch_size", "precision"]].reset_index()
    (results / "bench" / "remeasured").mkdir(exist_ok=True)
    pd.concat([later, failed.assign(error="out of memory")]).to_csv(results / "bench" / "remeasured" / name,
                                                                     index=False)
    pd.DataFrame({"method": ["e2e", "checkpoint"], "idle_ms_per_step": [2.0, None],
                  "idle_dispatch_ms_per_step": [0.5, None], "git_commit": "d" * 40,
                  "error": [None, "idle analysis: KeyError: 0"]}).to_csv(results / "bench" / f"idle-{name}",
                                                                           index=False)
    pd.DataFrame({"method": ["e2e"], "error": ["out of memory"]}).to_csv(results / "bench" / f"profile-{name}",
                                                                          index=False)
    table, caption = table3(results)
    table = table.set_index("method")
    assert list(table.loc[["e2e", "checkpoint"], "ours: time vs E2E"]) == ["+0.0%", "+0.0%"]
    untouched = bench.loc["greedy:4", "step_seconds_vs_e2e"]
    assert table.loc["greedy:4", "ours: time vs E2E"] == f"{100 * (untouched - 1):+.1f}%"
    assert list(table.loc[["e2e", "checkpoint"], "ours: GPU idle (ms/step)"]) == ["2.0 (0.5)", "–"]
    assert "ours: busy time vs E2E" not in table and "Busy time" not in caption


def test_a_re_measurement_of_every_method_is_named_as_such():
    """'The others' would name no method when a later call timed them all (the retime stage)."""
    bench = pd.DataFrame({"method": ["e2e", "checkpoint"], "git_commit": "a" * 40, "timed_at": "b" * 40})
    assert remeasured_times(bench) == ("step times of every method re-measured at bbbbbbb (bench/remeasured/), "
                                       "against that call's E2E; memory from the step table at aaaaaaa")
    assert "the others at aaaaaaa" in remeasured_times(bench.assign(timed_at=["b" * 40, "a" * 40]))


def test_a_work_csv_without_operator_counts_shows_its_flops_and_a_dash():
    """A work CSV written before operators were counted, or cut to FLOPs by hand, was a KeyError."""
    flops_only = pd.DataFrame({"method": ["e2e", "checkpoint"], "step_flops_vs_e2e": [1.0, 1.25]})
    assert extra_work(flops_only, "checkpoint") == {"ours: FLOPs vs E2E": "+25.0%", "ours: operators vs E2E": "–"}


def test_fig_memory_sets_time_against_operators_where_the_work_was_counted():
    """One point per method whose operators were counted at the step table's batch (offload's are
    not, off a GPU): ResNet-110's 16 methods and ResNet-32's 13 in the committed results."""
    figure = memory_figure(RESULTS)
    time_vs_operators = [ax for ax in figure.axes if ax.get_title().endswith("time vs operators")]
    assert [len(ax.collections) for ax in time_vs_operators] == [15, 12]
    assert all(ax.get_lines() for ax in time_vs_operators)  # the diagonal


def test_a_step_time_far_above_every_other_is_drawn_at_the_edge_with_its_value():
    """Offloading's ten-fold step put every other ResNet-110 method of the time panel on one line."""
    assert off_scale_top([906.0, 70.0, 10.0, 0.0]) == pytest.approx(87.5)
    assert off_scale_top([260.0, 47.0, 0.0]) is None  # 5.5 times the next: every point fits
    assert off_scale_top([5.0, -10.0]) is None and off_scale_top([3.0]) is None
    figure = memory_figure(RESULTS)
    time_vs_memory = {ax.get_title().split(",")[0]: ax for ax in figure.axes
                      if ax.get_title().endswith("time vs memory")}
    offload = [text.get_text() for text in time_vs_memory["resnet110"].texts if "off scale" in text.get_text()]
    assert len(offload) == 1 and time_vs_memory["resnet110"].get_ylim()[1] < 100
    assert not any("off scale" in text.get_text() for text in time_vs_memory["resnet32"].texts)


def test_make_alone_lists_every_target_with_what_it_does():
    """A target added without its `## ` text on its rule's line would be left out of the list."""
    listed = subprocess.run(["make"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    phony = re.search(r"^\.PHONY: (.*)$", (REPO / "Makefile").read_text(), flags=re.M).group(1).split()
    described = {line.split()[0] for line in listed.stdout.splitlines() if len(line.split()) > 1}
    assert sorted(set(phony) - set(TARGETS) - described) == []
    assert all(f" {target} " in listed.stdout for target in TARGETS)


def test_make_status_lists_the_grid_in_the_results_given(tmp_path):
    (tmp_path / "runs").mkdir()
    status = subprocess.run(["make", "-s", "status", f"RESULTS={tmp_path}", "GRID=cpu-fixture"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "== cpu-fixture" and lines[-3:] == [
        "0 done, 0 partial, 17 missing", "17 runs not timed (no seed of theirs has run an epoch)",
        "17 runs without a GPU share on record (no epoch of their configuration on a GPU recorded when it ran, "
        "no epoch benchmark of it and no pace of it on a GPU to scale)"]
    assert "cifar10-jpeg-resnet32-e2e-K1-n10000-e12-b128-s0" in status.stdout  # the committed runs' dataset
    both = subprocess.run(["make", "-s", "status", f"RESULTS={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # by default, Table 2's two grids: the methods', then DGL's row
    assert both.returncode == 0, both.stderr
    assert [line for line in both.stdout.splitlines() if line.startswith("==")] == [
        "== table2-resnet32", "== table2-dgl-resnet32"]


def test_make_builds_figures_and_tables_in_one_process_per_command():
    """`make -n` prints the commands without running them: `make figures tables` is one build of
    every figure, one of every table, and one each of the CPU fixture's figures and tables its claims
    cite; targets named together are one build of them all, with the options given."""
    def builds(*goals) -> list[list[str]]:
        dry = subprocess.run(["make", "-n", *goals], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        return [line.split() for line in dry.stdout.splitlines() if "analysis.build" in line]

    def targets(commands) -> list[list[str]]:
        return [[word for word in words if word in TARGETS] for words in commands]

    every = builds("figures", "tables")
    assert targets(every) == [list(FIGURES), ["fig8", "fig10"], list(TABLES), ["table2", "claims"]]
    assert ["fixture" in words for words in every] == [False, True, False, True]
    together = builds("fig8", "table2", "fig7", "probes", "ARCH=resnet110")
    assert targets(together) == [["fig7", "fig8", "table2"]] and "resnet110" in together[0]
    assert targets(builds("fig10")) == [["fig10"]]


def test_a_missing_csv_names_the_target_that_makes_it(tmp_path):
    (tmp_path / "runs").mkdir()
    for target, maker in (("fig8", "make probes"), ("fig10", "make mutual-info"), ("fig7", "experiments.grid"),
                          ("fig_curves", "experiments.grid"),
                          ("table_schedule", "grid cpu-schedule-check"), ("fig_schedule", "make schedule-analysis"),
                          ("table_paired", "make test-predictions"), ("table_e2e_gap", "make test-predictions"),
                          ("table_ranking", "make test-predictions"),
                          ("table_remainder_budget", "analysis.remainder ceiling` and `layers` (remainder_budget.csv: "
                                                     "`budget`)"),
                          ("table_remainder_budget_means", "(remainder_budget.csv: `budget`)")):
        result = run_main("analysis.build", target, "--results", str(tmp_path))
        assert result.returncode == 2 and maker in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def first_cell_blank(text: str) -> str:
    header, first, rest = text.split("\n", 2)
    return "\n".join([header, first[first.index(","):], rest])


UNREADABLE = [  # (target, input, how it is damaged, what the one line says)
    ("fig8", "analysis/linear_probe.csv", lambda text: "", "is empty, garbled or cut short (EmptyDataError)"),
    ("fig10", "analysis/mutual_information.csv", lambda text: text.split(",", 1)[0] + "\n",
     "lacks the columns regime, K, seed"),
    ("table_paired", "analysis/test_predictions.csv", first_cell_blank, "has a blank run_id in data row 1"),
    ("fig_schedule", "analysis/schedule-check/linear_probe.csv", first_cell_blank, "has a blank run_id in data row 1"),
    ("table3", "bench/resnet110-b1024-fp32-nvidia-h100-80gb-hbm3.csv", lambda text: text + '"cut',
     "is empty, garbled or cut short (ParserError)"),
    ("table2", "reference/table2.csv", lambda text: "", "is empty"),
    ("fig_curves", "runs/cifar10-jpeg-resnet32-infopro-contrast-K8-s0/metrics.csv", first_cell_blank,
     "has a blank epoch in data row 1"),
    ("fig7", "runs/cifar10-jpeg-resnet32-e2e-K1-n10000-e12-b128-s0/summary.json",  # was a KeyError traceback
     lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "final_test_error"}),
     "lacks final_test_error"),
]


@pytest.mark.parametrize("target,name,damage,message", UNREADABLE,
                         ids=[f"{case[0]}:{case[1].rsplit('/', 1)[-1]}" for case in UNREADABLE])
def test_an_unreadable_input_is_one_line_naming_it(target, name, damage, message, results_copy):
    path = results_copy / name
    text = path.read_text()
    path.write_text(damage(text))
    try:
        result = run_main("analysis.build", target, "--results", str(results_copy))
    finally:
        path.write_text(text)
    assert result.returncode == 2 and f"{path} {message}" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_schedule_check_pairs_each_longer_run_only_with_its_twin(tmp_path):
    """A twin has the same config and seed and fewer epochs; the table averages the pairs over seeds."""
    from infopro.config import TrainConfig
    from infopro.train import train
    tiny = dict(dataset="synthetic", train_subset=64, test_subset=32, batch_size=32, warmup_epochs=1)

    def trained(folder, **config):
        train(TrainConfig(**tiny, **config), tmp_path / folder, device="cpu", log=lambda line: None)

    for seed in (0, 1):
        trained(f"runs/e2e-{seed}", regime="e2e", epochs=2, seed=seed)
        trained(f"longer/e2e-{seed}", regime="e2e", epochs=3, seed=seed)
    trained("runs/greedy", regime="greedy", K=2, epochs=2)               # no longer twin
    trained("longer/greedy", regime="greedy", K=2, epochs=3, lr=0.05)     # another lr: not a twin
    trained("runs/e2e-4-epochs", regime="e2e", epochs=4)                 # more epochs: not shorter
    pairs = schedule_pairs(find_runs(tmp_path / "runs"), find_runs(tmp_path / "longer"))
    assert sorted(pairs["seed"]) == [0, 1] and set(pairs["regime"]) == {"e2e"}
    short = [read_json(tmp_path / f"runs/e2e-{seed}/summary.json")["final_test_error"] for seed in (0, 1)]
    long = [read_json(tmp_path / f"longer/e2e-{seed}/summary.json")["final_test_error"] for seed in (0, 1)]
    assert list(pairs.sort_values("seed")["test_error_short"]) == short
    table, caption = schedule_check(pairs)
    row = table.iloc[0]
    assert len(table) == 1 and row["n"] == 2 and "2 and 3 epochs" in caption
    assert row["test error (%), 3 epochs"] == mean_std(pd.Series(long).mean(), pd.Series(long).std())


def recipe_runs(epochs: int, train_images: int, configurations: list, errors: list) -> pd.DataFrame:
    """Stand-in run rows of one recipe: one seed per (regime, K), with the given final errors."""
    return pd.DataFrame({
        "arch": "resnet32", "split": "paper", "regime": [regime for regime, _ in configurations],
        "task_loss": "contrast", "K": [K for _, K in configurations], "seed": 0, "epochs": epochs,
        "train_images": train_images, "recipe": f"{train_images} images, {epochs} epochs", "final_test_error": errors})


def test_figures_show_the_papers_recipe_and_the_fixture_only_on_request():
    """The most-trained recipe is the default even where the CPU fixture covers more configurations;
    `fixture` names the toy."""
    fixture = recipe_runs(12, 10_000, [("e2e", 1), ("greedy", 2), ("infopro", 2)], [30.0, 33.0, 35.0])
    first_gpu_runs = recipe_runs(160, 50_000, [("e2e", 1), ("greedy", 2)], [10.9, 14.3])
    assert main_recipe(with_method(pd.concat([fixture, first_gpu_runs])))[1] == "50000 images, 160 epochs"
    assert main_recipe(with_method(fixture))[1] == "10000 images, 12 epochs"
    assert recipe_rows(pd.concat([fixture, first_gpu_runs]), "fixture").equals(fixture)


def test_figures_and_table2_keep_architectures_and_split_kinds_apart():
    """A recipe's label does not name the network, and InfoPro* (balanced split) has a K = 2 too:
    ResNet-110 runs of the same recipe, or InfoPro* runs, once entered the ResNet-32 curves and means."""
    probes = pd.read_csv(RESULTS / "analysis" / "linear_probe.csv")
    fixture = probes[probes["epochs"] == 12]
    deeper = fixture[fixture["K"] <= 2].assign(arch="resnet110", test_error=fixture["test_error"] + 40)  # fewer K
    balanced = fixture[fixture["K"] == 2].assign(split="balanced", test_error=99.0)
    alone, mixed = (fig8_linear_probes(rows, load_reference(RESULTS, "analysis_figure"))
                    for rows in (fixture, pd.concat([deeper, fixture, balanced])))
    for a, b in zip(alone.axes, mixed.axes):
        assert [list(line.get_ydata()) for line in a.get_lines()] == [list(line.get_ydata()) for line in b.get_lines()]
    assert "resnet32," in mixed.texts[-1].get_text()
    deeper_only = fig8_linear_probes(deeper, load_reference(RESULTS, "analysis_figure"))
    assert "resnet110," in deeper_only.texts[-1].get_text()
    assert "paper, greedy SL (read off)" not in [text.get_text() for text in deeper_only.legends[0].get_texts()]
    assert "paper, greedy SL (read off)" in [text.get_text() for text in mixed.legends[0].get_texts()]
    plt.close(alone), plt.close(mixed), plt.close(deeper_only)

    runs = recipe_runs(160, 50_000, [("e2e", 1), ("greedy", 2), ("infopro", 2)], [10.9, 14.3, 11.7])
    others = pd.concat([runs[runs["K"] == 1].assign(arch="resnet110", final_test_error=50.0),
                        runs[runs["K"] == 2].assign(split="balanced", final_test_error=60.0)])
    reference = load_reference(RESULTS, "table2")
    ours = "ours, 160 epochs: test error (%)"
    shown = table2(pd.concat([others, runs]), reference)[0].set_index(["method", "K"])[ours]
    assert [shown[("E2E", 1)], shown[("Greedy SL", 2)], shown[("InfoPro (Contrast)", 2)]] == ["10.90", "14.30", "11.70"]
    assert main_recipe(with_method(pd.concat([others, runs])))[0]["arch"].eq("resnet32").all()
    as_deep = pd.concat([runs.assign(arch="resnet110"), runs])  # a tie goes to the paper's analysis network
    assert main_recipe(with_method(as_deep))[0]["arch"].eq("resnet32").all()
    for draw in (figure_rows, lambda rows: table2(rows, reference)):
        with pytest.raises(InfoProError, match="no run here is cut at the paper's equal-depth split points"):
            draw(others[others["split"] == "balanced"])


def test_a_target_of_a_named_network_draws_only_its_runs_beside_the_default(tmp_path, results_copy):
    """`--arch` shows a network that covers fewer configurations than another (ResNet-110 beside
    ResNet-32 here), with `--recipe` or alone; a network without runs is one line."""
    probes = pd.read_csv(RESULTS / "analysis" / "linear_probe.csv")
    fixture = probes[probes["epochs"] == 12]
    deeper = fixture[fixture["K"] <= 2].assign(arch="resnet110", test_error=fixture["test_error"] + 40)
    both = pd.concat([fixture, deeper])
    assert RowPicker("12 epochs", "resnet110")(both).equals(deeper)
    assert RowPicker(None, "resnet32")(both).equals(fixture)
    results = tmp_path / "results"
    shutil.copytree(RESULTS / "reference", results / "reference")
    (results / "analysis").mkdir()
    both.to_csv(results / "analysis" / "linear_probe.csv", index=False)
    paths = build("fig8", results, recipe="12 epochs", arch="resnet110")
    assert [path.name for path in paths] == ["fig8-resnet110-12-epochs.png", "fig8-resnet110-12-epochs.pdf"]

    refused = run_main("analysis.build", "fig8", "--results", str(results_copy), "--arch", "resnet110")
    assert refused.returncode == 2
    assert refused.stderr == "error: no run of resnet110 here; the networks in results are: resnet32\n"
    refused = run_main("analysis.build", "table3", "--results", str(results_copy), "--arch", "resnet32")
    assert refused.returncode == 2
    assert refused.stderr == ("error: --arch applies to fig7, fig8, fig10, fig_info_plane, fig_curves, table2, "
                              "not table3\n")


def test_a_figure_of_a_named_recipe_draws_only_its_runs_beside_the_default_figure(results_copy):
    fixture = recipe_runs(12, 10_000, [("e2e", 1), ("greedy", 2), ("infopro", 2)], [30.0, 33.0, 35.0])
    first_gpu_runs = recipe_runs(160, 50_000, [("e2e", 1), ("greedy", 2)], [10.9, 14.3])
    assert recipe_rows(pd.concat([fixture, first_gpu_runs]), "160 epochs").equals(first_gpu_runs)
    for text, refusal in (("200 epochs", "no recipe matches"), ("epochs", "several recipes match")):
        with pytest.raises(InfoProError, match=f"{refusal} --recipe '{text}'; the recipes in results are: 10000"):
            recipe_rows(pd.concat([fixture, first_gpu_runs]), text)

    recipe = sorted(pd.read_csv(results_copy / "analysis" / "linear_probe.csv")["recipe"].unique())[0]
    paths = build("fig8", results_copy, recipe=recipe)
    assert [path.name for path in paths] == [f"fig8-{re.sub('[^a-z0-9]+', '-', recipe.lower())}{suffix}"
                                             for suffix in (".png", ".pdf")]
    assert [path.name for path in build("table2", results_copy, recipe="fixture")][0] == "table2-fixture.csv"
    result = run_main("analysis.build", "table3", "--results", str(results_copy), "--recipe", "160 epochs")
    assert result.returncode == 2
    assert result.stderr == ("error: --recipe applies to fig7, fig8, fig10, fig_info_plane, fig_curves, table2, "
                             "claims, not table3\n")


def test_the_claims_of_a_named_recipe_are_judged_on_its_runs_and_point_at_its_figures(results_copy):
    """`make claims RECIPE=fixture`: the same rules on the fixture's runs and analyses, Table 3's claim aside."""
    fixture = with_method(recipe_rows(load_runs(results_copy), "fixture"))
    e2e = fixture.loc[(fixture["method"] == "e2e") & (fixture["arch"] == "resnet32"), "final_test_error"].mean()
    default, of_fixture = (pd.read_csv(build("claims", results_copy, recipe=recipe)[0]) for recipe in (None, "fixture"))
    assert of_fixture["ours"].iloc[0].startswith(f"E2E {e2e:.2f}; ")
    assert default["ours"].iloc[0] != of_fixture["ours"].iloc[0]
    assert list(of_fixture["from"]) == [path if path == "tables/table3.md" else path.replace(".", "-fixture.")
                                        for path in default["from"]]
    assert of_fixture["ours"].iloc[-1] == default["ours"].iloc[-1]  # Table 3 trains nothing: no recipe of its own


def test_table2_shows_the_papers_recipe_beside_the_paper_and_the_fixture_on_request():
    """Every configuration of the paper's Table 2 has its row, trained or not; the 12-epoch fixture,
    though it covers more configurations, is shown only when asked for."""
    fixture = recipe_runs(12, 10_000, [("e2e", 1), ("greedy", 2), ("infopro", 2), ("dgl", 2)], [30.0, 33.0, 35.0, 34.0])
    first_gpu_runs = recipe_runs(160, 50_000, [("e2e", 1), ("greedy", 2)], [10.87, 14.34])
    table, caption = table2(pd.concat([fixture, first_gpu_runs]), load_reference(RESULTS, "table2"))
    rows = table.set_index(["method", "K"])
    assert list(table.columns[2:]) == ["ours, 160 epochs: test error (%)", "n, 160 epochs", "paper: test error (%)",
                                       "160 epochs − paper"]
    assert rows.loc[("E2E", 1), "160 epochs − paper"] == "+3.50"  # the paper's E2E: 7.37
    assert rows.loc[("InfoPro (Contrast)", 2), "ours, 160 epochs: test error (%)"] == "–"
    assert rows.loc[("InfoPro (Contrast)", 2), "n, 160 epochs"] == 0 and "160 epochs: 50000 images" in caption
    assert list(rows.index.get_level_values("method").unique()) == ["E2E", "Greedy SL", "DGL", "InfoPro (Contrast)",
                                                                    "InfoPro (Softmax)"]
    assert rows.loc[("DGL", 16), "paper: test error (%)"] == "16.21 ± 0.36"  # the paper's DGL row, not yet run
    toy = table2(recipe_rows(pd.concat([fixture, first_gpu_runs]), "fixture"), load_reference(RESULTS, "table2"))[0]
    assert toy.set_index(["method", "K"]).loc[("DGL", 2), "12 epochs − paper"] == "+25.31"


def test_latex_tables_use_booktabs_and_escape():
    tex = to_latex(pd.DataFrame({"method": ["a_b"], "error (%)": ["1.00 ± 0.10"]}), "cap", "tab:x")
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"a\_b" in tex and r"\%" in tex and r"$\pm$" in tex


@pytest.mark.slow
def test_probes_and_mutual_info_run_end_to_end_on_a_run(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS / "reference", results / "reference")
    from infopro.config import TrainConfig
    from infopro.train import train

    train(TrainConfig(regime="greedy", K=2, dataset="synthetic", epochs=1, train_subset=300, test_subset=100,
                      batch_size=50), results / "runs" / "tiny", device="cpu", log=lambda line: None)

    def make(*args):
        result = subprocess.run(["make", *args, f"RESULTS={results}"], cwd=REPO,
                                              capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    make("probes", "PROBE_ARGS=--layers 1,8,16")
    make("mutual-info", "MI_ARGS=--layers 1,8,16 --epochs 1")
    assert "already analysed" in make("probes", "PROBE_ARGS=--layers 1,8,16")
    probes = pd.read_csv(results / "analysis" / "linear_probe.csv")
    mi = pd.read_csv(results / "analysis" / "mutual_information.csv")
    assert list(probes["layer"]) == [1, 8, 16] and probes.loc[probes["layer"] == 8, "module_end"].item()
    assert list(mi["layer"]) == [1, 8, 16] and mi["ixy_normalised"].between(-1, 1).all()
    make("fig8", "fig10", "fig_info_plane", "fig7", "fig_curves", "table2")
    for made in ("figures/fig10.pdf", "figures/fig_info_plane.png", "figures/fig_curves.png", "tables/table2.tex"):
        assert (results / made).exists(), made


@pytest.mark.slow
def test_schedule_analysis_draws_only_seeds_analysed_after_both_lengths(tmp_path):
    """`make schedule-analysis` analyses the runs SCHEDULE_RUNS names in runs/ and schedule-check/;
    fig_schedule keeps a seed only where it was analysed after both schedule lengths."""
    from infopro.config import TrainConfig
    from infopro.train import train
    results = tmp_path / "results"
    tiny = dict(regime="greedy", K=2, dataset="synthetic", train_subset=64, test_subset=32, batch_size=32,
                warmup_epochs=1)
    for folder, epochs, seed in (("runs/s0", 1, 0), ("runs/s1", 1, 1), ("schedule-check/s0", 2, 0)):
        train(TrainConfig(**tiny, epochs=epochs, seed=seed), results / folder, device="cpu", log=lambda line: None)
    made = subprocess.run(["make", "schedule-analysis", "fig_schedule", f"RESULTS={results}", "SCHEDULE_RUNS=synthetic",
                           "PROBE_ARGS=--layers 1,8,16", "MI_ARGS=--layers 1,8,16 --epochs 1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    analysed = pd.read_csv(results / "analysis" / "schedule-check" / "mutual_information.csv")
    assert sorted(zip(analysed["seed"], analysed["epochs"]))[::3] == [(0, 1), (0, 2), (1, 1)]
    probes, mi = load_schedule_analysis(results)
    for rows in (probes, mi):
        assert sorted(set(zip(rows["seed"], rows["epochs"]))) == [(0, 1), (0, 2)]
    assert (results / "figures" / "fig_schedule.png").stat().st_size > 10_000


def test_fig_schedule_draws_one_row_per_k_each_beside_e2e():
    """A second K gets its own row of panels holding only its methods and E2E, and the footer
    names the seeds each row shows (here K = 8 is the committed K = 4 greedy SL rows, relabelled)."""
    from infopro import layer_plots
    probes, mi = (rows[rows["K"].isin([1, 4])] for rows in load_schedule_analysis(RESULTS))

    def with_k8(rows):
        return pd.concat([rows, rows[rows["method"] == "greedy"].assign(K=8, seed=7)])
    figure = layer_plots.fig_schedule(with_k8(probes), with_k8(mi))
    axes = figure.get_axes()
    assert len(axes) == 6 and [ax.get_title() for ax in axes[::3]] == ["linear separability, K = 4",
                                                                       "linear separability, K = 8"]
    lines_k4 = 2 * probes[["method", "K"]].drop_duplicates().shape[0]
    assert [len(ax.get_lines()) for ax in axes] == [lines_k4] * 3 + [4] * 3  # E2E and greedy SL, 12 and 36 epochs
    assert "K = 8: seed 7" in figure.texts[-1].get_text().replace("\n", " ")


def test_fig8_draws_the_seed_mean_and_shades_the_seed_range_only_where_there_are_several_seeds():
    probes = pd.read_csv(RESULTS / "analysis" / "linear_probe.csv")
    one_seed = probes[(probes["seed"] == 0) & (probes["epochs"] == 12)]
    three_seeds = pd.concat([one_seed.assign(seed=seed, test_error=one_seed["test_error"] + 2 * seed)
                             for seed in (0, 1, 2)])
    reference = load_reference(RESULTS, "analysis_figure")
    for rows, shaded in ((one_seed, False), (three_seeds, True)):
        figure = fig8_linear_probes(rows, reference)
        greedy = figure.axes[0]
        bands = [c for c in greedy.collections if isinstance(c, PolyCollection)]
        curves = [line for line in greedy.get_lines() if line.get_label().startswith("K = ")]
        assert len(bands) == (len(curves) if shaded else 0) and len(curves) == 5  # E2E and K = 2, 4, 8, 16
        e2e = one_seed[one_seed["regime"] == "e2e"].sort_values("layer")["test_error"]
        assert list(curves[0].get_ydata()) == pytest.approx(list(e2e + (2 if shaded else 0)))  # the mean
        if shaded:
            band = bands[0].get_paths()[0].vertices[:, 1]  # E2E's: seed 0 below, seed 2 (+4) above
            assert (band.min(), band.max()) == pytest.approx((e2e.min(), e2e.max() + 4))
        footer = figure.texts[-1].get_text().replace("\n", " ")
        assert ("n = 3 seeds per point; shading: lowest to highest seed" in footer) == shaded
        assert ("n = 1 seed per point." in footer) == (not shaded)
        plt.close(figure)


def test_fig8_counts_the_seeds_at_each_layer_point_and_draws_a_line_through_the_seeds_read_at_all_of_them():
    """Every curve with a second seed, 10 points worse, at its first eight layer points only: no point has
    more seeds than its own, so the footer reads 1-2, not the curves' 2; the line stays seed 0's, with no
    step at layer 8 where the second seed ends, and the band reaches the second seed."""
    probes = pd.read_csv(RESULTS / "analysis" / "linear_probe.csv")
    one_seed = probes[(probes["seed"] == 0) & (probes["epochs"] == 12)]
    early = one_seed[one_seed["layer"] <= 8].assign(seed=1, test_error=lambda rows: rows["test_error"] + 10)
    figure = fig8_linear_probes(pd.concat([one_seed, early]), load_reference(RESULTS, "analysis_figure"))
    footer = figure.texts[-1].get_text().replace("\n", " ")
    assert "n = 1-2 seeds per point; shading: lowest to highest seed; a line: the seeds read at all its points" \
        in footer
    e2e_line = next(line for line in figure.axes[0].get_lines() if line.get_label() == "K = 1 (E2E)")
    e2e = one_seed[one_seed["regime"] == "e2e"].sort_values("layer")["test_error"]
    assert list(e2e_line.get_ydata()) == pytest.approx(list(e2e))
    band = [c for c in figure.axes[0].collections if isinstance(c, PolyCollection)][0].get_paths()[0].vertices[:, 1]
    assert band.max() == pytest.approx(e2e[e2e.index.isin(early.index)].max() + 10)
    plt.close(figure)


def test_a_curve_averages_the_seeds_read_at_all_its_points_or_every_seed_where_none_is():
    rows = pd.DataFrame({"seed": [0, 0, 0, 1, 1, 2], "layer": [1, 2, 3, 1, 3, 2], "v": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]})
    assert list(seeds_at_every_point(rows, "v")["seed"]) == [0, 0, 0]
    assert list(seeds_at_every_point(rows, ["v"])["seed"]) == [0, 0, 0]
    unread = rows.assign(v=rows["v"].where(rows.index != 2))  # seed 0 without layer 3: no seed has all three
    assert seeds_at_every_point(unread, "v").equals(unread)


def test_the_information_plane_puts_every_method_of_a_k_beside_e2e_on_shared_axes():
    """Each panel's paths are the seed means per layer of its K's methods and of E2E, ending in an
    arrowhead at the last layer; E2E alone is one panel."""
    mi = with_method(pd.read_csv(RESULTS / "analysis" / "mutual_information.csv"))
    fixture = mi[(mi["epochs"] == 12) & (mi["estimator"] == "1c2f")]
    figure = fig_information_plane(fixture)
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["K = 2", "K = 4", "K = 8", "K = 16"]
    assert len({(ax.get_xlim(), ax.get_ylim()) for ax in panels}) == 1
    for ax, K in zip(panels, (2, 4, 8, 16)):
        shown = fixture[(fixture["K"] == K) | (fixture["method"] == "e2e")]
        paths = {line.get_label(): line for line in ax.get_lines()}
        assert list(paths) == ["E2E", "Greedy SL", "DGL", "InfoPro (Contrast)", "InfoPro (Softmax)"]
        means = shown[shown["method"] == "greedy"].groupby("layer")[["ixx_normalised", "ixy_normalised"]].mean()
        assert list(paths["Greedy SL"].get_xdata()) == pytest.approx(list(means["ixx_normalised"]))
        assert list(paths["Greedy SL"].get_ydata()) == pytest.approx(list(means["ixy_normalised"]))
        heads = [text.xy for text in ax.texts]
        assert len(heads) == 5 and heads[1] == pytest.approx(tuple(means.iloc[-1]))
    seeds = fixture.groupby(["method", "K", "layer"])["seed"].nunique()
    counts = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    assert f"n = {counts} seeds per point" in figure.texts[-1].get_text().replace("\n", " ")
    plt.close(figure)
    alone = fig_information_plane(fixture[fixture["method"] == "e2e"])
    assert [ax.get_title() for ax in alone.axes] == ["E2E"] and len(alone.axes[0].get_lines()) == 1
    plt.close(alone)


def test_training_curves_hold_every_epoch_of_finished_and_unfinished_runs(tmp_path):
    """An unfinished run (metrics.csv, no summary.json) is read with the finished ones; a folder
    whose run has not finished an epoch is left out. The unfinished run is a finished one cut back
    to its first 91 epochs, so the test does not depend on how far the committed grid has got."""
    finished, unfinished = "cifar10-jpeg-resnet32-e2e-K1-s0", "cifar10-jpeg-resnet32-greedy-K8-s0"
    shutil.copytree(RESULTS / "runs" / finished, tmp_path / finished, ignore=shutil.ignore_patterns("*.pt"))
    recorded = unfinished_copy(RESULTS / "runs" / unfinished, tmp_path / unfinished, 91)
    (tmp_path / "not-started").mkdir()
    shutil.copy(RESULTS / "runs" / unfinished / "config.json", tmp_path / "not-started")
    curves = training_curves(tmp_path)
    stands = curves.groupby("run_id").agg(last=("epoch", "max"), rows=("epoch", "size"), finished=("finished", "all"))
    assert stands.to_dict("index") == {finished: {"last": 160, "rows": 160, "finished": True},
                                       unfinished: {"last": 91, "rows": 91, "finished": False}}
    assert list(curves.loc[curves["run_id"] == unfinished, "test_error"]) == list(recorded["test_error"])
    assert set(curves["epochs"]) == {160} and set(curves["K"]) == {1, 8}


def test_training_curves_average_the_seeds_that_reached_each_epoch_and_mark_where_unfinished_runs_stop():
    """A second E2E seed stopped at epoch 50 (2 points above seed 0) moves the mean up to epoch 50
    only; each unfinished run gets an open marker where it stops and a place in the footer. Built
    on the committed finished runs of seed 0 with stand-in unfinished seeds, so it holds however far
    the grid has got."""
    curves = training_curves(RESULTS / "runs")
    gpu = curves[(curves["epochs"] == 160) & curves["finished"] & (curves["seed"] == 0)]
    e2e = gpu[gpu["regime"] == "e2e"]
    greedy_k8 = gpu[(gpu["regime"] == "greedy") & (gpu["K"] == 8)]

    def stopped_seed(run: pd.DataFrame, epoch: int, name: str) -> pd.DataFrame:
        return run[run["epoch"] <= epoch].assign(seed=1, run_id=name, finished=False,
                                                 test_error=lambda rows: rows["test_error"] + 2)

    figure = fig_training_curves(pd.concat([gpu, stopped_seed(e2e, 50, "e2e-seed-1"),
                                            stopped_seed(greedy_k8, 91, "greedy-K8-seed-1")]))
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == [f"{error} error, K = {K}" for error in ("test", "train") for K in (2, 4, 8, 16)]
    test_k2, test_k8 = figure.axes[0], figure.axes[2]
    line = next(line for line in test_k2.get_lines() if line.get_label() == "E2E")
    expected = e2e["test_error"].to_numpy() + [1.0 if epoch <= 50 else 0.0 for epoch in e2e["epoch"]]
    assert list(line.get_ydata()) == pytest.approx(list(expected))

    def stops(ax) -> list[tuple]:
        return [tuple(point) for c in ax.collections if isinstance(c, PathCollection) for point in c.get_offsets()]

    assert stops(test_k2) == [(50, pytest.approx(expected[49]))]
    assert stops(test_k8) == [(50, pytest.approx(expected[49])),
                              (91, pytest.approx(greedy_k8["test_error"].iloc[90] + 1))]
    footer = figure.texts[-1].get_text().replace("\n", " ")
    assert "E2E seed 1: epoch 50 of 160" in footer and "Greedy SL K = 8 seed 1: epoch 91 of 160" in footer
    assert "n = 1-2 seeds per line" in footer
    plt.close(figure)


def test_the_notebooks_layer_table_keeps_recipes_apart_and_shows_e2e_and_greedy():
    """It once averaged the 12-epoch fixture with the 160-epoch runs and dropped the methods whose
    task_loss is blank; split kinds (InfoPro*'s K = 2 beside InfoPro's) stay apart too."""
    probes = pd.read_csv(RESULTS / "analysis" / "linear_probe.csv")
    probes = pd.concat([probes, probes[probes["K"] == 2].assign(split="balanced", test_error=99.0)])
    table = layer_table(probes, "test_error")
    assert len(table.columns) == probes.drop_duplicates(["recipe", "regime", "task_loss", "K", "split"]).shape[0]
    for (recipe, method, K, split), rows in with_method(probes).groupby(["recipe", "method", "K", "split"]):
        mean = rows.loc[rows["layer"] == 16, "test_error"].mean()
        assert table.loc[16, ("resnet32", recipe, method, K, split)] == pytest.approx(mean)
    assert {"e2e", "greedy"} <= set(table.columns.get_level_values("method"))
    fixture_e2e = probes[(probes["epochs"] == 12) & (probes["regime"] == "e2e")]
    partial = fixture_e2e[fixture_e2e["layer"] == 16].assign(seed=9, test_error=99.0)  # one point of a new seed
    column = ("resnet32", fixture_e2e["recipe"].iloc[0], "e2e", 1, "paper")
    assert layer_table(pd.concat([probes, partial]), "test_error")[column].equals(table[column])  # as fig8 draws


def test_analysis_computes_only_missing_layers_and_keeps_finished_ones(tmp_path):
    from infopro.analysis import analyse_runs
    from infopro.config import TrainConfig
    from infopro.train import train
    train(TrainConfig(regime="e2e", dataset="synthetic", epochs=1, train_subset=64, test_subset=32,
                      batch_size=32), tmp_path / "runs" / "r", device="cpu", log=lambda line: None)
    runs, calls = find_runs(tmp_path / "runs"), []

    def fake(run, layers):
        calls.append(list(layers))
        return [{"run_id": run.run_id, "setting": 1, "task_loss": "", "layer": layer, "value": layer}
                for layer in layers]

    def settings(run):
        return {"setting": 1}

    csv = tmp_path / "out.csv"
    analyse_runs(runs, csv, fake, settings, [1, 2], log=lambda line: None)
    analyse_runs(runs, csv, fake, settings, None, log=lambda line: None)   # all 16: only 3..16 missing
    analyse_runs(runs, csv, fake, settings, None, log=lambda line: None)   # nothing left
    assert calls == [[1, 2], list(range(3, 17))]
    assert sorted(pd.read_csv(csv)["layer"]) == list(range(1, 17))
    assert "nan" not in csv.read_text()  # a blank cell read back as NaN is written blank again

    def another_analysis_writes_meanwhile(run, layers):
        def other(run, layers):
            return [row | {"setting": 2} for row in fake(run, layers)]
        analyse_runs(runs, csv, other, lambda run: {"setting": 2}, [1], log=lambda line: None)
        return fake(run, layers)

    calls.clear()
    analyse_runs(runs, csv, another_analysis_writes_meanwhile, settings, [5], force=True, log=lambda line: None)
    written = pd.read_csv(csv)
    assert sorted(written["setting"]) == [1] * 16 + [2]  # both analyses' rows: neither wrote over the other's
    calls.clear()
    with pytest.raises(InfoProError, match=r"layer points must lie in 1\.\.16, got \[0, 17\]"):
        analyse_runs(runs, csv, fake, settings, [0, 16, 17], force=True, log=lambda line: None)
    assert not calls  # nothing analysed
    (tmp_path / "a-file").write_text("")  # where the CSV's folder must be: refused before any layer
    with pytest.raises(InfoProError, match="cannot write results in .*a-file"):
        analyse_runs(runs, tmp_path / "a-file" / "out.csv", fake, settings, [1], log=lambda line: None)
    assert not calls


def test_an_analysis_resumes_though_another_estimators_rows_leave_its_settings_blank(tmp_path):
    """The remainder estimator's rows leave the 1c2f settings blank and the other way round, so pandas
    reads both as float (10 as 10.0): neither analysis may then take its own finished rows for missing."""
    from infopro.analysis import analyse_runs
    from infopro.config import TrainConfig
    from infopro.layer_plots import mutual_info_text, remainder_text
    from infopro.train import train
    train(TrainConfig(regime="e2e", dataset="synthetic", epochs=1, train_subset=64, test_subset=32,
                      batch_size=32), tmp_path / "runs" / "r", device="cpu", log=lambda line: None)
    runs, calls = find_runs(tmp_path / "runs"), []

    def estimator(settings):
        def analyse(run, layers):
            calls.append(settings)
            return [{"run_id": run.run_id, "task_loss": "", "layer": layer} | settings for layer in layers]
        return analyse, lambda run: settings

    csv = tmp_path / "out.csv"
    small_head, remainder = {"estimator": "1c2f", "est_epochs": 10}, {"estimator": "remainder", "rem_epochs": 12}
    for settings in (small_head, remainder, small_head, remainder):
        analyse_runs(runs, csv, *estimator(settings), [1, 2], log=lambda line: None)
    assert calls == [small_head, remainder] and len(pd.read_csv(csv)) == 4
    row = pd.read_csv(csv).iloc[0].to_dict()  # the footers read such rows: est_epochs is 10.0
    images = {"mi_train_images": 2000, "mi_test_images": 1000}
    assert "Adam lr 0.003, 10 epochs" in mutual_info_text(row | images | {"est_lr": 0.003})
    assert "batch 512, 30 epochs" in remainder_text(row | images | {"rem_lr": 0.4, "rem_batch_size": 512.0,
                                                                    "rem_epochs": 30.0, "rem_precision": "bf16"})


def test_an_analysis_names_the_code_it_started_with_not_what_is_committed_meanwhile(tmp_path, monkeypatch):
    """Hours of estimates in a checkout where work goes on: every row names the commit its process loaded."""
    import infopro.analysis
    from infopro.analysis import analyse_runs
    from infopro.config import TrainConfig
    from infopro.train import train
    train(TrainConfig(regime="e2e", dataset="synthetic", epochs=1, train_subset=64, test_subset=32,
                      batch_size=32), tmp_path / "runs" / "r", device="cpu", log=lambda line: None)
    commits = iter(["a" * 40, "b" * 40])
    monkeypatch.setattr(infopro.analysis, "git_state", lambda: {"git_commit": next(commits), "git_dirty": False})

    def committing_meanwhile(run, layers):
        infopro.analysis.git_state()  # a commit lands while the layers are estimated
        return [{"run_id": run.run_id, "task_loss": "", "layer": layer, "value": layer} for layer in layers]

    csv = tmp_path / "out.csv"
    analyse_runs(find_runs(tmp_path / "runs"), csv, committing_meanwhile, lambda run: {}, [1, 2], log=lambda line: None)
    assert set(pd.read_csv(csv)["analysis_commit"]) == {"a" * 40}


def test_a_legend_of_long_labels_stays_within_its_figure():
    """fig10 of E2E and one K beside the paper's curves and the ceiling: five entries, two of them long."""
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from infopro.plots import legend_columns, shared_legend
    from infopro.style import RC

    labels = ["K = 1 (E2E)", "K = 4", "end of a local module", "paper, greedy SL and E2E (read off)",
              "ceiling: the architecture trained on x, same budget"]
    with mpl.rc_context(RC):
        figure = Figure(figsize=(8, 3))
        ax = figure.subplots()
        for label in labels:
            ax.plot([0, 1], [0, 1], label=label)
        shared_legend(figure, ax)
        legend = figure.legends[0].get_window_extent(FigureCanvasAgg(figure).get_renderer())
        assert legend.x0 >= 0 and legend.x1 <= figure.bbox.width
        assert legend_columns(["K = 2", "K = 4", "K = 8"], 8) == 3  # short labels keep a row
