"""Module-parallel training (one gloo rank per local module) against the synchronous trainer."""

import json
import os
import signal
from functools import partial

import pandas as pd
import pytest
import torch

from conftest import run_cli
from experiments.train_pipeline import rank_job
from infopro.errors import InfoProError
from infopro.distributed import spawn_ranks
from infopro.module_parallel import ideal_speedup
from infopro.train import TrainConfig, train

SMALL = dict(dataset="synthetic", train_subset=320, test_subset=128, epochs=2, batch_size=64, lr=0.05,
             warmup_epochs=0)


@pytest.fixture
def one_thread():
    """Bit-equality needs equal float summation order: one thread in the reference and in every rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def test_a_negative_staleness_is_refused_by_every_rank_instead_of_deadlocking(tmp_path):
    """With S < 0 no rank may ever start a batch; the library refuses it, not only the command line."""
    with pytest.raises(InfoProError, match=r"^rank \d: max_staleness must be 0 or more, got -1$"):
        pipeline(TrainConfig(regime="greedy", K=2, **SMALL), tmp_path / "run", max_staleness=-1)
    assert not (tmp_path / "run").exists()


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
    done = run_cli("experiments.bench_module_parallel", "--K", "2", "--staleness", "0", "--train-subset", "128",
                   "--batch-size", "64", "--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "K=2 synchronous: " in done.stdout and "K=2 module-parallel, max staleness 0: " in done.stdout
    table = pd.read_csv(tmp_path / "module-parallel-resnet32-infopro-b64-cpu.csv")
    assert list(table["trainer"]) == ["synchronous", "module-parallel"]
    assert (table["images_per_second"] > 0).all() and table["speedup"].iloc[0] == 1.0
    module_ms = [float(v) for v in table["module_ms"].iloc[0].split(";")]
    assert len(module_ms) == 2 and table["ideal_speedup"].iloc[0] == pytest.approx(sum(module_ms) / max(module_ms),
                                                                                   rel=1e-3)
