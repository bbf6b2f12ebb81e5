"""Run directories: resume equivalence, determinism, divergence, and one-line errors."""

import json
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from conftest import REPO, run_cli, run_main
import infopro.train
from infopro.cli import stop_children
from infopro.config import TrainConfig
from infopro.errors import DataError, DivergedError, RunDirError
from infopro.records import git_state
from infopro.rundir import RunDir
from infopro.runs import find_runs, finished_runs
from infopro.train import train

TINY = TrainConfig(regime="greedy", K=2, dataset="synthetic", train_subset=128, test_subset=64,
                   epochs=3, batch_size=64, lr=0.05, warmup_epochs=1)


def quiet(line):
    pass


def weights(run):
    return torch.load(run / "model.pt", weights_only=True)


def test_resume_ends_where_an_uninterrupted_run_ends(tmp_path):
    train(TINY, tmp_path / "whole", device="cpu", log=quiet)
    assert train(TINY, tmp_path / "cut", device="cpu", log=quiet, stop_after_epoch=1) is None
    assert (tmp_path / "cut" / "checkpoint.pt").exists() and not (tmp_path / "cut" / "model.pt").exists()
    train(TINY, tmp_path / "cut", device="cpu", log=quiet, resume=True)
    whole, cut = (pd.read_csv(tmp_path / name / "metrics.csv") for name in ("whole", "cut"))
    columns = [c for c in whole.columns if c != "epoch_seconds"]
    pd.testing.assert_frame_equal(whole[columns], cut[columns])
    cut_weights = weights(tmp_path / "cut")
    for name, tensor in weights(tmp_path / "whole").items():
        assert torch.equal(tensor, cut_weights[name]), name
    assert not (tmp_path / "cut" / "checkpoint.pt").exists()  # resume state only while unfinished
    assert "resumed" in json.loads((tmp_path / "cut" / "config.json").read_text())


def test_same_seed_same_result_other_seed_differs(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        train(TrainConfig(**{**TINY.__dict__, "seed": seed, "epochs": 1}), tmp_path / name,
              device="cpu", log=quiet)
    a, b, c = (weights(tmp_path / name) for name in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_a_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(TINY, run, device="cpu", log=quiet, stop_after_epoch=1)
    real_step = infopro.train.train_step

    def diverging_step(*args, **kwargs):
        losses, wrong = real_step(*args, **kwargs)
        return losses * float("nan"), wrong
    monkeypatch.setattr(infopro.train, "train_step", diverging_step)
    with pytest.raises(DivergedError, match="non-finite loss in epoch 2.*checkpoint of epoch 1"):
        train(TINY, run, device="cpu", log=quiet, resume=True)
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert len(pd.read_csv(run / "metrics.csv")) == 1


def test_a_corrupt_checkpoint_or_model_is_one_error_naming_the_file(tmp_path):
    assert train(TINY, tmp_path / "cut", device="cpu", log=quiet, stop_after_epoch=1) is None
    checkpoint = tmp_path / "cut" / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    with pytest.raises(DataError, match="checkpoint.pt is corrupt, truncated"):
        train(TINY, tmp_path / "cut", device="cpu", log=quiet, resume=True)
    assert "resumed" not in json.loads((tmp_path / "cut" / "config.json").read_text())

    train(TINY, tmp_path / "runs" / "whole", device="cpu", log=quiet)
    model = tmp_path / "runs" / "whole" / "model.pt"
    model.write_bytes(b"not a tensor file")
    with pytest.raises(DataError, match="model.pt is corrupt, truncated"):
        find_runs(tmp_path / "runs")[0].load_net()
    torch.save({"head.weight": torch.zeros(1)}, model)
    with pytest.raises(DataError, match="model.pt does not hold this run's network"):
        find_runs(tmp_path / "runs")[0].load_net()


def test_a_directory_holding_another_run_is_refused(tmp_path):
    run = tmp_path / "run"
    train(TINY, run, device="cpu", log=quiet, stop_after_epoch=1)
    with pytest.raises(RunDirError, match="different run.*seed 0 -> 1"):
        train(TrainConfig(**{**TINY.__dict__, "seed": 1}), run, device="cpu", log=quiet)
    with pytest.raises(RunDirError, match="pass --resume"):
        train(TINY, run, device="cpu", log=quiet)


def test_a_run_being_trained_is_refused_to_a_second_trainer_until_it_is_released(tmp_path):
    run = tmp_path / "run"
    train(TINY, run, device="cpu", log=quiet, stop_after_epoch=1)
    record = json.loads((run / "config.json").read_text())
    first = RunDir(run, record)
    first.open(resume=True)  # as a grid started twice would: the run is still in training
    with pytest.raises(RunDirError, match="being trained by another process"):
        train(TINY, run, device="cpu", log=quiet, resume=True)
    assert len(pd.read_csv(run / "metrics.csv")) == 1
    first.release()
    assert train(TINY, run, device="cpu", log=quiet, resume=True)["epochs"] == TINY.epochs
    with pytest.raises(RunDirError, match="different run"):  # a refusal leaves the directory free
        train(TrainConfig(**{**TINY.__dict__, "seed": 1}), run, device="cpu", log=quiet)
    RunDir(run, record).open(resume=True)


def test_cli_writes_the_run_files(tmp_path):
    out = tmp_path / "run"
    result = run_cli("experiments.train", "--arch", "resnet32", "--regime", "infopro", "--K", "4",
                     "--dataset", "synthetic", "--epochs", "1", "--train-subset", "128",
                     "--test-subset", "64", "--batch-size", "64", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "metrics.csv", "model.pt", "summary.json"]
    record = json.loads((out / "config.json").read_text())
    assert record["resolved"]["module_ends"] == [4, 8, 12]
    assert record["resolved"]["lambda1"] == [6, 3.5, 1]
    assert {"git_commit", "git_dirty", "torch", "device_name", "cpu_capability", "cpu_generation"} <= set(
        record["provenance"])
    assert record["dataset"]["name"] == "synthetic" and len(record["dataset"]["fingerprint"]) == 16
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peak_saved_activation_bytes"] > 0 and summary["peak_cuda_allocated_bytes"] is None
    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics.columns) == ["epoch", "lr", "loss_m1", "loss_m2", "loss_m3", "loss_m4",
                                     "train_error", "test_error", "epoch_seconds", "ended_at"]
    assert metrics["ended_at"].is_monotonic_increasing and metrics["ended_at"].iloc[0] > 1.7e9  # Unix seconds


BAD_INPUTS = [
    (["--arch", "resnet18", "--regime", "e2e"], "invalid choice: 'resnet18'"),
    (["--regime", "dni"], "invalid choice: 'dni'"),
    (["--regime", "infopro", "--K", "2", "--task-loss", "mse"], "invalid choice: 'mse'"),
    (["--regime", "e2e", "--dataset", "imagenet"], "invalid choice: 'imagenet'"),
    (["--regime", "e2e", "--K", "4"], "regime e2e trains one module"),
    (["--regime", "greedy", "--K", "5"], "no paper split table for resnet32 with K=5"),
    (["--regime", "e2e", "--dataset", "cifar10", "--data-root", "/nonexistent"], "CIFAR-10 not found"),
    (["--regime", "e2e", "--dataset", "cifar10-jpeg", "--data-root", "/nonexistent"], "cifar10-jpeg not found"),
    (["--regime", "e2e", "--bogus"], "unrecognized arguments: --bogus"),
    (["--regime", "e2e", "--lr", "-1"], "--lr must be positive and finite, got -1.0"),  # was a traceback
    (["--regime", "e2e", "--seed", "-1"], "--seed must be 0 or more, got -1"),  # was a traceback
    (["--regime", "infopro", "--K", "2", "--lambda1", "-1", "--lambda2", "1"],
     "--lambda1 weights must be finite and 0 or more, got (-1.0,"),  # was trained, exit 0
    (["--regime", "greedy", "--K", "2", "--task-loss", "softmax"],  # was plain greedy SL, exit 0
     "--task-loss: InfoPro's options, meaningless for --regime greedy"),
    (["--regime", "e2e", "--lambda1", "1,1", "--lambda2", "1,1"],
     "--lambda1, --lambda2: InfoPro's options, meaningless for --regime e2e"),
    (["--regime", "greedy"], "--regime greedy with --K 1 is end-to-end training"),  # trained E2E as greedy-K1
    (["--regime", "e2e", "--split", "balanced"], "--split: one module (end-to-end) has no module ends"),
    (["--regime", "greedy", "--K", "5", "--dataset", "cifar10", "--data-root", "/nonexistent"],
     "no paper split table for resnet32 with K=5"),  # the missing data was reported first
    (["--regime", "e2e", "--train-subset", "5001"],  # trained on all 5,000 as "-n5001"
     "--train-subset 5001 exceeds the 5,000 train images of synthetic; give at most 5000"),
    (["--regime", "e2e", "--test-subset", "1001"], "--test-subset 1001 exceeds the 1,000 test images of synthetic"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS)
def test_bad_input_gets_one_line_and_non_zero_exit(args, message, tmp_path):
    if "--dataset" not in args:
        args = [*args, "--dataset", "synthetic"]
    tiny = ["--epochs", "1", "--train-subset", "64", "--test-subset", "64"]  # a case wrongly accepted fails fast
    result = run_main("experiments.train", *tiny, *args, "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


BAD_NUMBERS = [  # (entry point, options, message); OUT stands for the folder the command must not write
    ("experiments.grid", ["table2-resnet32", "--jobs", "0", "--out", "OUT"],  # scheduled nothing, waited forever
     "argument --jobs: 0 is below the smallest allowed value"),
    ("experiments.grid", ["table2-resnet32", "--jobs", "two", "--out", "OUT"], "argument --jobs: 'two' is not an"),
    ("experiments.grid", ["table2-resnet32", "--measure-jobs", "1", "0", "--out", "OUT"],
     "argument --measure-jobs: 0 is below"),
    ("experiments.bench", ["--quick", "--batch-size", "0", "--out", "OUT"], "argument --batch-size: 0 is below"),
    ("experiments.bench", ["--quick", "--warmup", "-1", "--out", "OUT"], "argument --warmup: -1 is below the smallest"),
    ("experiments.bench_module_parallel", ["--staleness", "0", "-1", "--out", "OUT"], "argument --staleness: -1 is"),
    ("experiments.bench_module_parallel", ["--K", "1", "--out", "OUT"], "argument --K: 1 is below the smallest"),
    ("experiments.bench_module_parallel", ["--K", "2", "3", "--out", "OUT"],  # refused after measuring K=2
     "the paper gives no λ1/λ2 for resnet32 K=3"),
    ("experiments.train_pipeline", ["--regime", "greedy", "--K", "2", "--max-staleness", "-1", "--out", "OUT"],
     "argument --max-staleness: -1 is below the smallest allowed value, 0"),
    ("experiments.train", ["--regime", "e2e", "--dataset", "synthetic", "--time-budget", "0", "--out", "OUT"],
     "argument --time-budget: 0 is not a finite number above 0"),  # trained one epoch
    ("experiments.grid", ["table2-resnet32", "--time-budget", "nan", "--out", "OUT"],  # meant no budget at all
     "argument --time-budget: nan is not a finite number above 0"),
    ("experiments.reproduce", ["--time-budget", "5", "--pack-to", "OUT", "--pack-mib", "inf"],  # was a traceback
     "argument --pack-mib: inf is not a finite number above 0"),
]


@pytest.mark.parametrize("entry_point,args,message", BAD_NUMBERS)
def test_a_number_outside_its_range_is_refused_before_any_work(entry_point, args, message, tmp_path):
    out = tmp_path / "out"
    result = run_main(entry_point, *[str(out) if arg == "OUT" else arg for arg in args])
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("entry_point,args,message", [
    ("experiments.train", ["--regime", "e2e", "--dataset", "synthetic", "--train-subset", "64", "--test-subset", "64",
                           "--epochs", "1"], "FILE is a file, not a run directory; choose another --out"),
    ("experiments.grid", ["cpu-fixture", "--dataset", "synthetic"], "--out FILE is a file; give the folder"),
])
def test_a_file_where_the_output_folder_must_be_is_one_line(entry_point, args, message, tmp_path):
    file = tmp_path / "file"
    file.write_text("kept")
    result = run_main(entry_point, *args, "--out", str(file))
    assert result.returncode != 0 and message.replace("FILE", str(file)) in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and file.read_text() == "kept"


def test_corrupt_archive_and_divergence_on_the_command_line(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b broken")
    result = run_main("experiments.train", "--regime", "e2e", "--dataset", "cifar10",
                      "--data-root", str(tmp_path), "--out", str(tmp_path / "a"))
    assert result.returncode == 2 and "corrupt archive" in result.stderr
    result = run_cli("experiments.train", "--regime", "e2e", "--dataset", "synthetic", "--lr", "1e30",
                     "--warmup-epochs", "0", "--epochs", "2", "--train-subset", "128", "--test-subset", "32",
                     "--batch-size", "64", "--out", str(tmp_path / "b"))
    assert result.returncode == 3 and "non-finite loss" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("analysis", ["analysis.probe", "analysis.mutual_info", "analysis.score_test_images"])
def test_an_analysis_of_no_runs_is_an_error_not_an_empty_result(analysis, tmp_path):
    """A mistyped --runs used to analyse nothing and exit 0; the CSV must not be written either."""
    out = tmp_path / "out.csv"
    missing = run_main(analysis, "--runs", str(tmp_path / "typo"), "--out", str(out))
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: {tmp_path / 'typo'}: no such folder of runs"
    empty = run_main(analysis, "--runs", str(tmp_path), "--out", str(out))
    assert empty.returncode == 2 and empty.stderr.strip() == f"error: no finished run under {tmp_path}"
    assert not out.exists()


@pytest.mark.parametrize("analysis,option,message", [
    ("analysis.probe", ["--l2", "-1"], "the probe's L2 penalty must be >= 0, got -1.0"),
    ("analysis.mutual_info", ["--epochs", "0"], "the estimators need epochs >= 1"),
    ("analysis.mutual_info", ["--lr", "-0.1"], "the estimators need epochs >= 1"),
    ("analysis.probe", ["--layers", "0,17"], "layer points must lie in 1..16, got [0, 17]"),
    # refused only after looking for the data, once
    ("analysis.mutual_info", ["--train-subset", "0"], "argument --train-subset: 0 is below"),
])
def test_an_analysis_setting_that_would_mean_nothing_stops_before_any_work(analysis, option, message, tmp_path):
    """A negative L2 once fitted a probe anyway (90% error at layer 1, exit 0)."""
    result = run_main(analysis, "--runs", "results/runs", "--only", "e2e-K1-n10000-e12-b128-s0", *option,
                      "--data-root", str(tmp_path), "--out", str(tmp_path / "out.csv"))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("analysis", ["analysis.probe", "analysis.score_test_images"])
def test_an_analysis_whose_csv_is_garbled_stops_in_one_line_and_keeps_the_file(analysis, tmp_path):
    """It reads its CSV to skip finished networks: a garbled one was a pandas traceback."""
    out = tmp_path / "out.csv"
    out.write_text('run_id,layer\n"cut')
    result = run_main(analysis, "--runs", "results/runs", "--only", "e2e-K1-n10000-e12-b128-s0",
                      "--data-root", str(tmp_path), "--out", str(out))
    assert result.returncode == 2 and f"{out} is empty, garbled or cut short (ParserError)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and out.read_text() == 'run_id,layer\n"cut'


def test_a_reader_closing_the_pipe_early_gets_no_traceback():
    """`... | head -1`: the listing stops quietly when its reader has read enough."""
    script = "from infopro.cli import run; run(lambda: [print('run', i) for i in range(100000)])"
    result = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "{script}" | head -1; exit ${{PIPESTATUS[0]}}'],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout == "run 0\n"
    assert result.stderr == "" and result.returncode == 1


def test_a_terminated_command_stops_its_child_and_says_so(tmp_path):
    """`kill` (SIGTERM) on a command running another stops that one too, as Ctrl-C does, with one line."""
    stopped = tmp_path / "child-stopped"
    child = (f"import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (open({str(stopped)!r}, 'w').close(), "
             f"sys.exit(0))); print('ready', flush=True); time.sleep(60)")
    parent = f"import sys; from infopro.cli import call, run; run(lambda: call([sys.executable, '-c', {child!r}]))"
    process = subprocess.Popen([sys.executable, "-c", parent], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    process.terminate()
    _, err = process.communicate(timeout=30)
    assert process.returncode == 143 and err == "terminated: work completed so far is kept\n"
    assert stopped.exists()


def test_a_sigterm_python_drops_leaves_the_command_stoppable_by_the_next():
    """Python prints and drops an exception raised in a weakref callback (one ends every import);
    a grid's training hit by its grid's SIGTERM there used to ignore every later one and train on."""
    script = ("import os, signal, time, weakref; from infopro.cli import run\n"
              "def main():\n"
              "    class Token: pass\n"
              "    token = Token()\n"
              "    def land_here(_):\n"
              "        os.kill(os.getpid(), signal.SIGTERM)\n"
              "        for _ in range(1000): pass\n"
              "    ref = weakref.ref(token, land_here)\n"
              "    del token\n"
              "    print('ready', flush=True)\n"
              "    time.sleep(60)\n"
              "run(main)\n")
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    process.terminate()
    _, err = process.communicate(timeout=30)
    assert "Exception ignored in" in err  # the first SIGTERM was dropped, as in the grid's training
    assert process.returncode == 143 and err.endswith("terminated: work completed so far is kept\n")


def test_stopping_children_sends_sigterm_again_to_one_that_dropped_it():
    """A child that lost the first SIGTERM is sent another rather than waited for until it ends."""
    child = ("import signal, sys, time\n"
             "seen = []\n"
             "def on_term(*_):\n"
             "    seen.append(1)\n"
             "    if len(seen) == 2: sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, on_term); print('ready', flush=True); time.sleep(60)\n")
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    began = time.monotonic()
    stop_children([process], resend_seconds=0.5)
    assert process.returncode == 0 and time.monotonic() - began < 30


def test_only_source_changes_make_a_record_dirty(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "probe.csv").write_text("run_id\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    assert git_state(tmp_path)["git_dirty"] is False
    (tmp_path / "results" / "probe.csv").write_text("run_id\nrun-a\n")
    assert git_state(tmp_path)["git_dirty"] is False
    (tmp_path / "model.py").write_text("x = 2\n")
    assert git_state(tmp_path)["git_dirty"] is True


def test_resume_refuses_a_run_that_lost_its_summary_instead_of_training_it_again(tmp_path):
    """A finished run whose summary.json was deleted has no checkpoint either: `--resume` used to train
    it from epoch 1 without a word, overwriting model.pt and metrics.csv."""
    config = TrainConfig(regime="e2e", dataset="synthetic", train_subset=64, test_subset=32, epochs=1, batch_size=32)
    train(config, tmp_path / "run", device="cpu", log=lambda line: None)
    (tmp_path / "run" / "summary.json").unlink()
    before = (tmp_path / "run" / "metrics.csv").read_text()
    with pytest.raises(RunDirError, match="holds model.pt and metrics.csv but neither summary.json nor checkpoint.pt"):
        train(config, tmp_path / "run", device="cpu", resume=True, log=lambda line: None)
    assert (tmp_path / "run" / "metrics.csv").read_text() == before


def test_a_damaged_run_outside_the_selection_does_not_stop_an_analysis(tmp_path):
    """One garbled config.json under --runs made every analysis refuse, even of the runs --only chose;
    a damaged run that --only names is still one line naming its file."""
    config = TrainConfig(regime="e2e", dataset="synthetic", train_subset=64, test_subset=32, epochs=1, batch_size=32)
    train(config, tmp_path / config.run_id(), device="cpu", log=lambda line: None)
    damaged = tmp_path / "other-run"
    shutil.copytree(tmp_path / config.run_id(), damaged)
    (damaged / "config.json").write_text("{ cut")
    assert [run.run_id for run in finished_runs(tmp_path, [config.run_id()])] == [config.run_id()]
    with pytest.raises(DataError, match="other-run/config.json is not valid JSON"):
        finished_runs(tmp_path, ["other"])
    with pytest.raises(DataError, match="is not valid JSON"):
        finished_runs(tmp_path)
