"""The grid runner: separate processes, finished runs skipped, partial ones resumed, budgets kept."""

import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, assert_free, run_cli, run_main, unfinished_copy
from infopro.config import TrainConfig, method_name
from infopro.errors import InfoProError
from infopro.grid import get_grid, measure_jobs, run_grid, steady_window, train_command
from infopro.grid_status import RunStatus, run_state, run_status, time_left_line
from infopro.selection import TABLE3_METHODS, run_of_method
from infopro.train import train

TINY = dict(dataset="synthetic", train_subset=100, test_subset=50, epochs=2, batch_size=50, lr=0.05,
            warmup_epochs=0)
CONFIGS = [TrainConfig(regime="e2e", **TINY), TrainConfig(regime="greedy", K=2, **TINY)]


@pytest.mark.slow
def test_a_grid_runs_its_runs_resumes_partial_ones_and_skips_finished_ones(tmp_path):
    train(CONFIGS[1], tmp_path / CONFIGS[1].run_id(), device="cpu", stop_after_epoch=1, log=lambda line: None)
    assert [run_state(c, tmp_path) for c in CONFIGS] == ["missing", "partial (1/2 epochs)"]
    lines = []
    outcome = run_grid(CONFIGS, tmp_path, jobs=2, device="cpu", log=lines.append)
    assert list(outcome.states.values()) == ["done", "done"] and outcome.failed == {} and outcome.unstarted == []
    resumed = json.loads((tmp_path / CONFIGS[1].run_id() / "config.json").read_text())
    assert len(resumed["resumed"]) == 1 and len(pd.read_csv(tmp_path / CONFIGS[1].run_id() / "metrics.csv")) == 2
    assert (tmp_path / "logs" / f"{CONFIGS[0].run_id()}.log").read_text().count("epoch ") >= 2

    again = []
    run_grid(CONFIGS, tmp_path, jobs=2, device="cpu", log=again.append)
    assert again == ["2 of 2 runs done; 0 to run, 2 at a time"]


def test_a_budget_too_short_for_a_run_starts_nothing_and_says_so(tmp_path):
    lines = []
    outcome = run_grid(CONFIGS, tmp_path, time_budget=30, device="cpu", log=lines.append)
    assert list(outcome.states.values()) == ["missing", "missing"]
    assert outcome.unstarted == [c.run_id() for c in CONFIGS] and outcome.failed == {}
    assert lines[-1] == "the time budget left 2 runs unstarted (a run starts only with more than a minute left)"
    assert not any(path.name != "logs" for path in tmp_path.iterdir())


@pytest.mark.slow
def test_a_failing_run_is_reported_with_its_message_and_the_others_go_on(tmp_path):
    missing_data = TrainConfig(regime="e2e", **{**TINY, "dataset": "cifar10"})
    lines = []
    outcome = run_grid([missing_data, CONFIGS[0]], tmp_path, jobs=1, device="cpu", data_root=tmp_path / "nothing",
                       log=lines.append)
    assert outcome.states == {missing_data.run_id(): "missing", CONFIGS[0].run_id(): "done"}
    assert list(outcome.failed) == [missing_data.run_id()] and outcome.failed[missing_data.run_id()].startswith(
        "exit 2: error: CIFAR-10 not found")
    assert any("missing (exit 2: error:" in line and "CIFAR-10" in line for line in lines), lines


@pytest.mark.slow
def test_a_grid_started_elsewhere_trains_into_the_folders_it_was_given(tmp_path, monkeypatch):
    """The trainings run in the repository root; relative paths must still mean the caller's folders."""
    monkeypatch.chdir(tmp_path)
    command = train_command(CONFIGS[0], Path("runs/x"), "cpu", "data")
    assert command[command.index("--out") + 1] == str(tmp_path.resolve() / "runs" / "x")
    assert command[command.index("--data-root") + 1] == str(tmp_path.resolve() / "data")
    outcome = run_grid(CONFIGS[:1], Path("runs"), device="cpu", log=lambda line: None)
    assert outcome.states == {CONFIGS[0].run_id(): "done"}
    assert (tmp_path / "runs" / CONFIGS[0].run_id() / "summary.json").exists()


def test_the_command_line_refuses_missing_data_before_any_run_and_fails_when_a_run_fails(tmp_path):
    grid = ["experiments.grid", "cpu-fixture", "--only", "e2e", "--seeds", "0", "--device", "cpu"]
    missing = run_main(*grid, "--data-root", str(tmp_path / "nothing"), "--out", str(tmp_path / "a"))
    assert missing.returncode == 2 and missing.stderr.startswith("error: cifar10-jpeg not found in")
    assert len(missing.stderr.splitlines()) == 1 and not (tmp_path / "a").exists()

    run_id = get_grid("cpu-fixture").configs([0], ["e2e"])[0].run_id()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cifar10-jpeg.tar.gz").write_bytes(b"not gzip")  # found, so each training fails on it
    failed = run_cli(*grid, "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "b"))
    assert failed.returncode == 1, failed.stderr
    assert f"{run_id}: missing (exit 2: error: corrupt archive {tmp_path / 'data' / 'cifar10-jpeg.tar.gz'}" \
        in failed.stdout
    assert failed.stdout.strip().endswith("0 of 1 runs done; run the command again to continue")
    assert failed.stderr == (f"error: 1 of 1 runs failed: {run_id} (the last line of each is above; "
                             f"their logs are in {tmp_path / 'b' / 'logs'})\n")


@pytest.mark.slow
def test_measured_jobs_add_up_concurrent_runs_and_mark_the_best(tmp_path):
    # Tiny epochs (0.1 s) against seconds of start-up per process: enough of them that two copies overlap
    # past their first epoch even on a busy machine.
    rows, trained_with = measure_jobs(CONFIGS[0], [1, 2], tmp_path, device="cpu", epochs=8)
    assert [row["jobs"] for row in rows] == [1, 2] and sum(row["best"] for row in rows) == 1
    assert all(row["images_per_second"] > 0 and row["window_seconds"] > 0 for row in rows)
    assert rows[1]["images_per_second"] == pytest.approx(2 * rows[1]["images_per_second_per_run"])
    # The provenance is the trainings' own record (only a run's has its precision), not this process's.
    recorded = json.loads((tmp_path / "jobs1-run0" / "config.json").read_text())["provenance"]
    assert trained_with == recorded and trained_with["precision"] == CONFIGS[0].precision


def epochs(*intervals):
    """metrics.csv columns of epochs that trained over the given (start, end) seconds."""
    return pd.DataFrame({"epoch_seconds": [end - start for start, end in intervals],
                         "ended_at": [end for _, end in intervals]})


def test_concurrent_runs_count_only_while_all_train_past_their_first_epoch():
    """Run b starts 1 s after a and both take 2 s an epoch: the window runs from b's first epoch's end
    (3 s) to a's last (6 s), in which each run trains 1.5 of its 2-s epochs: half of 2-4 and 4-6 for a,
    3-5 and half of 5-7 for b. Two runs at 50 images/s each: 100 images/s together."""
    a, b = epochs((0, 2), (2, 4), (4, 6)), epochs((1, 3), (3, 5), (5, 7))
    window, trained = steady_window([a, b], images=100)
    assert window == 3 and trained / window == pytest.approx(100)


def test_runs_that_never_trained_at_once_are_refused():
    """Adding each run's last epoch would call two runs that ran one after the other twice as fast."""
    with pytest.raises(InfoProError, match="never all trained past their first epoch at once"):
        steady_window([epochs((0, 2), (2, 4)), epochs((4, 6), (6, 8))], images=100)


def test_status_lists_every_run_of_the_grid(tmp_path):
    done = run_main("experiments.grid", "table2-resnet32", "--seeds", "1", "0", "1", "--status", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    *lines, counts, left, gpu = done.stdout.strip().splitlines()
    assert len(lines) == 26 and all(line.startswith("missing") for line in lines)  # seed 1 given twice runs once
    assert counts == "0 done, 0 partial, 26 missing"
    assert left == "26 runs not timed (no seed of theirs has run an epoch)"
    assert gpu.startswith("26 runs without a GPU share on record")
    assert lines[0].endswith("-s1") and lines[-5].endswith("-softmax-K16-s0")  # the seeds in the order given,
    assert lines[-1].endswith("-softmax-K16-s1")  # then softmax past the grid's first seed


def test_status_gives_each_runs_error_or_time_left_and_the_time_left_in_all(tmp_path):
    """Planning a lease needs all of it: the committed K = 8 runs of seed 0, one finished, one not
    (cut back to its first 91 epochs, however far the committed grid has got); seed 1's runs are
    timed by seed 0's recent pace, Softmax's not at all (no seed has run)."""
    committed = REPO / "results" / "runs"
    finished, unfinished = "cifar10-jpeg-resnet32-greedy-K8-s0", "cifar10-jpeg-resnet32-infopro-contrast-K8-s0"
    shutil.copytree(committed / finished, tmp_path / finished, ignore=shutil.ignore_patterns("*.pt"))
    unfinished_copy(committed / unfinished, tmp_path / unfinished, 91)
    status = run_main("experiments.grid", "table2-resnet32", "--dataset", "cifar10-jpeg", "--seeds", "0", "1",
                      "--only", "K8-", "--status", "--out", str(tmp_path), "--bench-out", str(tmp_path / "bench"))
    assert status.returncode == 0, status.stderr
    greedy = pd.read_csv(tmp_path / "cifar10-jpeg-resnet32-greedy-K8-s0" / "metrics.csv")["epoch_seconds"]
    contrast = pd.read_csv(tmp_path / "cifar10-jpeg-resnet32-infopro-contrast-K8-s0" / "metrics.csv")["epoch_seconds"]
    greedy, contrast = greedy.iloc[-10:].median(), contrast.iloc[-10:].median()  # the paces: last ten epochs
    left = (160 - 91) * contrast / 60
    error = json.loads((tmp_path / "cifar10-jpeg-resnet32-greedy-K8-s0" / "summary.json").read_text())
    in_all = left + 160 * greedy / 60 + 160 * contrast / 60
    assert status.stdout.splitlines() == [
        f"done                     cifar10-jpeg-resnet32-greedy-K8-s0: {error['final_test_error']:.2f}% test error",
        f"partial (91/160 epochs)  cifar10-jpeg-resnet32-infopro-contrast-K8-s0: about "
        f"{left:.0f} min left at its recent pace ({contrast:.1f} s an epoch)",
        "missing                  cifar10-jpeg-resnet32-infopro-softmax-K8-s0",
        f"missing                  cifar10-jpeg-resnet32-greedy-K8-s1: about {160 * greedy / 60:.0f} min "
        f"at seed 0's recent pace ({greedy:.1f} s an epoch)",
        f"missing                  cifar10-jpeg-resnet32-infopro-contrast-K8-s1: about "
        f"{160 * contrast / 60:.0f} min at seed 0's recent pace ({contrast:.1f} s an epoch)",
        "missing                  cifar10-jpeg-resnet32-infopro-softmax-K8-s1",
        "1 done, 1 partial, 4 missing",
        f"about {in_all:.0f} min of training left in 3 runs, each at the pace given; "
        "2 runs not timed (no seed of theirs has run an epoch)",
        # the committed K = 8 runs trained before each epoch recorded when it ran: no GPU share
        "5 runs without a GPU share on record (no epoch of their configuration on a GPU recorded when it ran, "
        "no epoch benchmark of it and no pace of it on a GPU to scale)"]


def test_a_runs_pace_is_its_last_ten_epochs_median(tmp_path):
    """A change to the step halves the pace mid-run, the lease's last epoch runs alone and one epoch
    ran on a CPU: the plan goes by the last ten epochs' median (15 s), not by the whole run's
    median (30 s) nor by the last epoch (1 s)."""
    config = replace(get_grid("table2-resnet32").configs(dataset="cifar10-jpeg")[0], epochs=160)
    seconds = [30.0] * 70 + [15.0] * 8 + [700.0, 1.0]
    run = tmp_path / config.run_id()
    run.mkdir()
    pd.DataFrame({"epoch": range(1, 81), "epoch_seconds": seconds}).to_csv(run / "metrics.csv", index=False)
    assert run_status(config, tmp_path).minutes_left == 80 * 15.0 / 60
    assert run_status(replace(config, seed=1), tmp_path).minutes_left == 160 * 15.0 / 60


def test_the_time_left_counts_the_runs_it_can_time_and_says_how_many_it_cannot():
    partial, timed, untimed = RunStatus("partial (1/2 epochs)", "", 1.4), RunStatus("missing", "", 2.0), \
        RunStatus("missing")
    assert time_left_line([partial, timed, untimed]) == ("about 3 min of training left in 2 runs, each at the pace "
                                                         "given; 1 run not timed (no seed of theirs has run an epoch)")
    assert time_left_line([timed]) == "about 2 min of training left in 1 run, each at the pace given"
    # DGL K = 8 stopped at epoch 151 of 160: a few seconds of training are not "about 0 min"
    assert time_left_line([RunStatus("partial (151/160 epochs)", "", 0.3)]) == (
        "under 1 min of training left in 1 run, each at the pace given")
    assert time_left_line([]) == "nothing left to train"


def test_the_paper_grid_runs_softmax_past_seed_0_after_every_run_table2_needs():
    """The issue asks three seeds of E2E, greedy SL and InfoPro (Contrast), and InfoPro (Softmax)
    at least at seed 0: the rare GPU time goes to those 31 runs before the 8 that add seeds."""
    runs = [config.run_id() for config in get_grid("table2-resnet32").configs()]
    assert len(runs) == len(set(runs)) == 39
    assert [run.split("-")[-1] for run in runs[:13]] == ["s0"] * 13
    assert runs[12].endswith("-infopro-softmax-K16-s0")
    assert not any("softmax" in run for run in runs[13:31])
    assert runs[31:] == [f"cifar10-resnet32-infopro-softmax-K{K}-s{seed}" for seed in (1, 2) for K in (2, 4, 8, 16)]
    assert [c.run_id() for c in get_grid("table2-resnet32").configs(seeds=[2])][-4:] == runs[-4:]


def test_the_resnet110_grids_train_what_table2_and_table3_read():
    """table3-resnet110 trains exactly the runs whose errors Table 3 reads (InfoPro*: balanced
    splits); table2-resnet110 is the ResNet-32 grid on the deeper network; one E2E run serves both."""
    def trained(grid):
        return {(method_name(c.regime, c.task_loss), c.K, c.split) for c in get_grid(grid).configs(seeds=[0])}

    whole_or_balanced = [m for m in TABLE3_METHODS if m in ("e2e", "checkpoint", "offload") or "balanced" in m]
    assert trained("table3-resnet110") == {run_of_method(method) for method in whole_or_balanced}
    both = trained("table3-resnet110") | trained("table2-resnet110")
    assert {run_of_method(method) for method in TABLE3_METHODS} <= both
    table2, table3 = (get_grid(grid).configs() for grid in ("table2-resnet110", "table3-resnet110"))
    assert [c.run_id() for c in table2] == [c.run_id().replace("resnet32", "resnet110")
                                             for c in get_grid("table2-resnet32").configs()]
    assert table3[0].run_id() == table2[0].run_id() == "cifar10-resnet110-e2e-K1-s0"


def test_every_schedule_check_run_has_a_fixture_twin_three_times_shorter():
    """table_schedule and fig_schedule pair each 36-epoch run with the fixture run of the same
    configuration and seed, so the two grids must hold the same configurations (DGL's included)."""
    longer = get_grid("cpu-schedule-check").configs(seeds=[0, 1, 2])
    twins = {replace(config, epochs=config.epochs // 3).run_id() for config in longer}
    assert twins == {config.run_id() for config in get_grid("cpu-fixture").configs(seeds=[0, 1, 2])}
    assert {c.epochs for c in longer} == {36} and any(c.regime == "dgl" for c in longer)


def test_only_runs_the_configurations_whose_run_id_matches(tmp_path):
    chosen = run_main("experiments.grid", "cpu-fixture", "--seeds", "2", "--only", "K2-", "--status",
                      "--out", str(tmp_path))
    assert chosen.returncode == 0, chosen.stderr
    assert [line.split()[-1] for line in chosen.stdout.strip().splitlines()[:-3]] == [
        f"cifar10-jpeg-resnet32-{method}-K2-n10000-e12-b128-s2"
        for method in ("greedy", "infopro-contrast", "infopro-softmax", "dgl")]
    refused = run_main("experiments.grid", "cpu-fixture", "--only", "K3-", "--status", "--out", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.strip() == "error: no configuration of the grid matches K3-"


@pytest.mark.slow
def test_a_terminated_grid_stops_its_trainings_and_frees_their_runs(tmp_path):
    """`kill` on a grid must not leave its trainings running alone, holding their runs' locks."""
    long = {**TINY, "epochs": 1000}
    config = TrainConfig(regime="e2e", **long)
    script = (f"from infopro.cli import run; from infopro.grid import run_grid; from infopro.config import TrainConfig; "
              f"from pathlib import Path; run(lambda: run_grid([TrainConfig(regime='e2e', **{long!r})], "
              f"Path({str(tmp_path)!r}), device='cpu'))")
    grid = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    run = tmp_path / config.run_id()
    began = time.monotonic()
    while not (run / "config.json").exists() and time.monotonic() - began < 120:  # the training has its run
        time.sleep(0.2)
    grid.terminate()
    _, err = grid.communicate(timeout=60)
    assert grid.returncode == 143 and err == "terminated: work completed so far is kept\n"
    assert (tmp_path / "logs" / f"{config.run_id()}.log").read_text().endswith("terminated: work completed so far is kept\n")
    assert_free(run)


def test_status_finds_the_dataset_of_the_runs_here_and_refuses_a_missing_folder(tmp_path):
    """The committed runs are cifar10-jpeg's: `--status` without --dataset said "0 done, 0 partial,
    39 missing" of the grid's cifar10; a folder that does not exist exited 0, and so did a file."""
    config = get_grid("cpu-fixture").configs(seeds=[0], only=["e2e"], dataset="synthetic")[0]
    (tmp_path / config.run_id()).mkdir()
    (tmp_path / config.run_id() / "metrics.csv").write_text("epoch,epoch_seconds\n1,2.0\n")
    status = run_main("experiments.grid", "cpu-fixture", "--seeds", "0", "--only", "e2e", "--status",
                      "--out", str(tmp_path))
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"no cifar10-jpeg run of cpu-fixture in {tmp_path}; showing its synthetic runs (--dataset picks one)"
    assert lines[1].startswith("partial (1/12 epochs)") and config.run_id() in lines[1]
    missing = run_main("experiments.grid", "cpu-fixture", "--status", "--out", str(tmp_path / "typo"))
    assert missing.returncode == 2 and missing.stderr == f"error: {tmp_path / 'typo'}: no such folder of runs\n"
    (tmp_path / "a-file").write_text("")
    refused = run_main("experiments.grid", "cpu-fixture", "--out", str(tmp_path / "a-file"), "--status")
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: --out {tmp_path / 'a-file'} is a file; ")
