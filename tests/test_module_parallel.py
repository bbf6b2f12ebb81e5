"""Module-parallel training (one gloo rank per local module) against the synchronous trainer."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import REPO, assert_free, run_cli
from experiments.train_pipeline import rank_job
from infopro.config import TrainConfig
from infopro.distributed import spawn_ranks
from infopro.errors import InfoProError
from infopro.module_parallel import ideal_speedup
from infopro.train import train

pytestmark = pytest.mark.slow  # one process per rank: minutes on 2 cores (make test-slow)

SMALL = dict(dataset="synthetic", train_subset=192, test_subset=64, epochs=2, batch_size=64, lr=0.05,
             warmup_epochs=0)


@pytest.fixture
def one_thread():
    """Bit-equality needs equal float summation order: one thread in the reference and in every rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def ctrl_c_raises():
    """These tests model a terminal's Ctrl-C. A shell's background job (`pytest ... &`) starts with SIGINT
    ignored, and Python then never raises KeyboardInterrupt, in itself or in the children it starts (an
    ignored signal stays ignored across exec; a handler resets to the default there)."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, saved)


def pipeline(config: TrainConfig, out, **options):
    options = {"data_root": None, "download": False, "resume": False, "time_budget": None} | options
    spawn_ranks(partial(rank_job, config=config, out=out, options=options), config.K, torch.device("cpu"))


def weights(run):
    return torch.load(run / "model.pt", weights_only=True)


def assert_same_run(a, b):
    left, right = (pd.read_csv(run / "metrics.csv") for run in (a, b))
    columns = [c for c in right.columns if c != "epoch_seconds"]
    pd.testing.assert_frame_equal(left[columns], right[columns])
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    final = [json.loads((run / "summary.json").read_text())["final_test_correct"] for run in (a, b)]
    assert final[0] == final[1]


@pytest.mark.parametrize("regime,K,task,staleness,weights", [
    ("greedy", 2, None, 0, {}),
    ("infopro", 4, "contrast", 2, {}),
    ("infopro", 3, "softmax", 1, {"lambda1": (5.0, 1.0), "lambda2": (0.5, 1.0)}),  # no paper λ at K = 3
])
def test_pipeline_computes_exactly_what_the_synchronous_trainer_computes(regime, K, task, staleness, weights,
                                                                         tmp_path, one_thread):
    config = TrainConfig(regime=regime, K=K, task_loss=task, **weights, **SMALL)
    train(config, tmp_path / "sync", device="cpu", log=lambda line: None)
    pipeline(config, tmp_path / "pipe", max_staleness=staleness)
    assert_same_run(tmp_path / "pipe", tmp_path / "sync")
    metrics = pd.read_csv(tmp_path / "pipe" / "metrics.csv")
    assert (metrics["max_staleness"] == staleness).all()
    assert metrics["max_lead"].max() <= staleness
    summary = json.loads((tmp_path / "pipe" / "summary.json").read_text())
    assert summary["module_parallel"]["ranks"] == K and summary["module_parallel"]["backend"] == "gloo"


def test_staleness_lets_ranks_run_ahead_within_the_bound_and_still_learns(tmp_path):
    config = TrainConfig(regime="greedy", K=2, **{**SMALL, "train_subset": 1000, "test_subset": 500,
                                                  "batch_size": 32, "epochs": 2})
    pipeline(config, tmp_path / "pipe", max_staleness=3)
    metrics = pd.read_csv(tmp_path / "pipe" / "metrics.csv")
    assert 0 < metrics["max_lead"].max() <= 3  # rank 0 starts batch t+1 before rank 1 has finished batch t
    # Chance is 90%. The error differs between hosts (45.00% on an AMD EPYC host, below 45% on earlier CI
    # hosts); 60% still fails a pipeline that does not learn.
    assert metrics["test_error"].iloc[-1] < 60


def test_either_trainer_resumes_the_others_run(tmp_path, one_thread):
    config = TrainConfig(regime="infopro", K=2, **SMALL)
    train(config, tmp_path / "whole", device="cpu", log=lambda line: None)
    pipeline(config, tmp_path / "pipeline-first", stop_after_epoch=1)
    assert not (tmp_path / "pipeline-first" / "model.pt").exists()
    train(config, tmp_path / "pipeline-first", device="cpu", resume=True, log=lambda line: None)
    assert_same_run(tmp_path / "pipeline-first", tmp_path / "whole")
    train(config, tmp_path / "synchronous-first", device="cpu", stop_after_epoch=1, log=lambda line: None)
    pipeline(config, tmp_path / "synchronous-first", resume=True)
    assert_same_run(tmp_path / "synchronous-first", tmp_path / "whole")


def fail_on_rank_one(me, config, out):
    """Rank 1 fails with a user error in its first epoch while the others wait on it."""
    if me.rank == 1:
        raise InfoProError("injected failure on rank 1")
    rank_job(me, config, out, {"data_root": None, "download": False, "resume": False, "time_budget": None})


def kill_rank_one(me, config, out):
    """Rank 1 dies without a word (the OOM killer, a lost node) while the others wait on it."""
    if me.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    rank_job(me, config, out, {"data_root": None, "download": False, "resume": False, "time_budget": None})


def test_a_failing_rank_stops_every_rank_with_its_message(tmp_path, capfd):
    config = TrainConfig(regime="greedy", K=3, **SMALL)
    with pytest.raises(InfoProError, match="^rank 1: injected failure on rank 1$") as failure:
        spawn_ranks(partial(fail_on_rank_one, config=config, out=tmp_path / "run"), 3, torch.device("cpu"))
    assert failure.value.exit_code == 2
    assert capfd.readouterr().err == ""  # the job's one line is the caller's to print


def test_a_killed_rank_stops_every_rank_and_says_how_it_died(tmp_path):
    config = TrainConfig(regime="greedy", K=2, **SMALL)
    with pytest.raises(InfoProError, match="^rank 1 was killed by SIGKILL, so every rank was stopped; finished epochs"):
        spawn_ranks(partial(kill_rank_one, config=config, out=tmp_path / "run"), 2, torch.device("cpu"))


def work_until_stopped(me, pids):
    (pids / str(me.rank)).write_text(str(os.getpid()))
    time.sleep(600)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_an_interrupted_job_returns_only_once_every_rank_is_gone(tmp_path):
    """Ctrl-C in a notebook or script driving `spawn_ranks`: the caller goes on living, so it must not
    be left with ranks still running or unreaped."""
    def interrupt_once_ranks_work():
        while len(list(tmp_path.iterdir())) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_ranks_work, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        spawn_ranks(partial(work_until_stopped, pids=tmp_path), 2, torch.device("cpu"))
    assert not [rank for rank in tmp_path.iterdir() if Path(f"/proc/{rank.read_text()}").exists()]


def test_a_negative_staleness_is_refused_by_every_rank_instead_of_deadlocking(tmp_path):
    """With S < 0 no rank may ever start a batch; the library refuses it, not only the command line."""
    with pytest.raises(InfoProError, match=r"^rank \d: max_staleness must be 0 or more, got -1$"):
        pipeline(TrainConfig(regime="greedy", K=2, **SMALL), tmp_path / "run", max_staleness=-1)
    assert not (tmp_path / "run").exists()


def ranks_of(pid: int) -> list[int]:
    """The spawned ranks among a process's children (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes()]


@pytest.mark.parametrize("stop,code,line", [
    (lambda job: job.terminate(), 143, "terminated"),  # kill, timeout, a job scheduler
    (lambda job: os.killpg(job.pid, signal.SIGINT), 130, "interrupted"),  # Ctrl-C reaches the whole group
])
@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_stopped_pipeline_ends_in_one_line_with_no_rank_left_holding_its_run(tmp_path, stop, code, line):
    run = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "experiments.train_pipeline", "--regime", "greedy", "--K", "2",
                            "--dataset", "synthetic", "--train-subset", "100", "--test-subset", "50", "--epochs", "1000",
                            "--batch-size", "50", "--warmup-epochs", "0", "--device", "cpu", "--out", str(run)],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    began = time.monotonic()
    while not (run / "metrics.csv").exists() and time.monotonic() - began < 120:  # the ranks are training
        time.sleep(0.1)
    ranks = ranks_of(job.pid)
    assert len(ranks) == 2
    stop(job)
    _, err = job.communicate(timeout=60)
    assert job.returncode == code and err == f"{line}: work completed so far is kept\n"
    assert not [rank for rank in ranks if Path(f"/proc/{rank}").exists()]  # no rank outlives the command
    assert_free(run)


def test_torchrun_runs_the_pipeline_and_refuses_a_wrong_world_size(tmp_path):
    options = ["--regime", "greedy", "--dataset", "synthetic", "--train-subset", "128", "--test-subset", "64",
               "--epochs", "1", "--batch-size", "64", "--device", "cpu"]
    torchrun = ["torch.distributed.run", "--nproc_per_node", "2", "-m", "experiments.train_pipeline"]
    done = run_cli(*torchrun, *options, "--K", "2", "--max-staleness", "1", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "summary.json").exists()
    refused = run_cli(*torchrun, *options, "--K", "4", "--out", str(tmp_path / "other"))
    assert refused.returncode != 0
    assert "K = 4 local modules need 4 ranks; got 2" in refused.stderr


def test_ideal_speedup_is_paced_by_the_slowest_module():
    assert ideal_speedup([1.0, 1.0, 1.0, 1.0]) == 4.0
    assert ideal_speedup([3.0, 1.0]) == pytest.approx(4 / 3)


def test_throughput_benchmark_writes_both_trainers_and_the_model(tmp_path):
    done = run_cli("experiments.bench_module_parallel", "--K", "2", "--staleness", "0", "--train-subset", "64",
                   "--test-subset", "32", "--batch-size", "32", "--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "K=2 synchronous: " in done.stdout and "K=2 module-parallel, max staleness 0: " in done.stdout
    table = pd.read_csv(tmp_path / "module-parallel-resnet32-infopro-b32-cpu.csv")
    assert list(table["trainer"]) == ["synchronous", "module-parallel"]
    assert (table["images_per_second"] > 0).all() and table["speedup"].iloc[0] == 1.0
    module_ms = [float(v) for v in table["module_ms"].iloc[0].split(";")]
    assert len(module_ms) == 2 and table["ideal_speedup"].iloc[0] == pytest.approx(sum(module_ms) / max(module_ms),
                                                                                   rel=1e-3)
