"""Replaying a finished run: it must match its record exactly, rebuild left-out weights, and say where it differs."""

import json
import subprocess

import pandas as pd
import pytest
import torch

from conftest import REPO, run_cli, run_main
import infopro.train
from infopro.config import TrainConfig
from infopro.device import ATEN_GRAIN
from infopro.errors import DataError, InfoProError
from infopro.grid import train_command
from infopro.retrain import retrain
from infopro.runs import load_run
from infopro.train import train

TINY = TrainConfig(regime="infopro", K=2, dataset="synthetic", train_subset=128, test_subset=64,
                   epochs=2, batch_size=64, lr=0.05, warmup_epochs=1)


def quiet(line):
    pass


def test_a_cpu_training_shares_one_exponential_among_all_threads_before_its_first_step(tmp_path, monkeypatch):
    """A process's first exponential can come out in other last bits on the second thread's share
    (docs/training.md, replays): a CPU training runs one over enough elements for every thread first."""
    events, real_exp, real_step = [], torch.exp, infopro.train.train_step

    def exp(tensor, *args, **kwargs):
        events.append(("exp", tensor.numel()))
        return real_exp(tensor, *args, **kwargs)

    def step(*args, **kwargs):
        events.append(("step", 0))
        return real_step(*args, **kwargs)

    monkeypatch.setattr(torch, "exp", exp)
    monkeypatch.setattr(infopro.train, "train_step", step)
    train(TrainConfig(**{**TINY.__dict__, "epochs": 1}), tmp_path / "run", device="cpu", log=quiet)
    before_the_first_step = events[:events.index(("step", 0))]
    assert ("exp", torch.get_num_threads() * ATEN_GRAIN) in before_the_first_step


@pytest.fixture
def finished(tmp_path):
    """A finished tiny run, and the weights it was trained to."""
    path = tmp_path / "runs" / "tiny"
    train(TINY, path, device="cpu", log=quiet)
    return path, torch.load(path / "model.pt", weights_only=True)


def test_a_replay_matches_its_record_and_rebuilds_weights_left_out(finished, tmp_path):
    path, trained = finished
    assert retrain(load_run(path), tmp_path / "work", log=quiet) == []  # metrics and weights compared
    (path / "model.pt").unlink()
    with pytest.raises(InfoProError, match="rebuild others with python -m experiments.retrain"):
        load_run(path).load_net()
    assert retrain(load_run(path), tmp_path / "work", restore=True, log=quiet) == []
    rebuilt = torch.load(path / "model.pt", weights_only=True)
    assert rebuilt.keys() == trained.keys() and all(torch.equal(rebuilt[k], trained[k]) for k in trained)
    provenance = json.loads((path / "weights.json").read_text())["replay_provenance"]
    assert provenance["device"] == "cpu" and provenance["git_commit"]


def test_a_replay_says_when_the_processor_differs_even_under_the_same_name(finished, tmp_path):
    path, _ = finished
    lines = []
    assert retrain(load_run(path), tmp_path / "work", log=lines.append) == []
    assert not any("recorded on" in line for line in lines), lines  # the same processor: nothing to say

    record = json.loads((path / "config.json").read_text())
    here = record["provenance"]
    # x86 has no family 0, so no host reports it (the family 25, model 1 written here before is an AMD
    # EPYC's: on one, the replay was on the "recorded" processor and the test failed)
    record["provenance"] = here | {"cpu_capability": "AVX2", "cpu_generation": "cpu family 0, model 0, stepping 0"}
    (path / "config.json").write_text(json.dumps(record))
    lines = []
    assert retrain(load_run(path), tmp_path / "work", log=lines.append) == []
    assert any(line.endswith(f"recorded on {here['device_name']} (AVX2, cpu family 0, model 0, stepping 0), "
                             f"replayed on {here['device_name']} ({here['cpu_capability']}, {here['cpu_generation']}); "
                             "kernels that differ between processors can change the last bits, "
                             "and training amplifies them") for line in lines), lines

    for key in ("cpu_capability", "cpu_generation"):
        del record["provenance"][key]  # a record from before these fields
    (path / "config.json").write_text(json.dumps(record))
    lines = []
    assert retrain(load_run(path), tmp_path / "work", log=lines.append) == []
    assert any(f"recorded on {here['device_name']} (instruction set and generation not recorded)" in line
               for line in lines), lines


def test_a_replay_that_differs_says_where_and_restores_nothing(finished, tmp_path):
    path, trained = finished
    recorded = (path / "metrics.csv").read_text()
    metrics = pd.read_csv(path / "metrics.csv")
    metrics.loc[1, "test_error"] += 0.5
    metrics.to_csv(path / "metrics.csv", index=False)
    (path / "model.pt").unlink()
    differences = retrain(load_run(path), tmp_path / "work", restore=True, log=quiet)
    assert len(differences) == 1 and differences[0].startswith("epoch 2 test_error: recorded")
    assert not (path / "model.pt").exists() and not (path / "weights.json").exists()

    (path / "metrics.csv").write_text(recorded)
    torch.save(trained | {"backbone.head.2.weight": trained["backbone.head.2.weight"] + 1}, path / "model.pt")
    assert retrain(load_run(path), tmp_path / "work", log=quiet) == ["model.pt tensor backbone.head.2.weight differs"]


def test_a_replay_stops_at_the_first_epoch_that_differs(finished, tmp_path):
    path, _ = finished
    metrics = pd.read_csv(path / "metrics.csv")
    metrics.loc[0, "loss_m1"] *= 1 + 1e-7  # a last-bits difference, as another processor's kernels make
    metrics.to_csv(path / "metrics.csv", index=False)
    work = tmp_path / "work"
    differences = retrain(load_run(path), work, log=quiet)
    assert differences[0].startswith("epoch 1 loss_m1: recorded")
    assert differences[-1] == "metrics.csv epochs: recorded 2, replayed 1"
    assert len(pd.read_csv(work / load_run(path).run_id / "metrics.csv")) == 1  # epoch 2 was never trained

    lines = []
    assert retrain(load_run(path), work, log=lines.append) == differences
    assert not any(line.startswith("epoch") for line in lines), lines  # a parted replay is not continued


def test_the_replayed_data_must_be_the_recorded_data(finished, tmp_path):
    path, _ = finished
    record = json.loads((path / "config.json").read_text())
    record["dataset"]["fingerprint"] = "0" * 16
    (path / "config.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="differs from the data"):
        retrain(load_run(path), tmp_path / "work", log=quiet)
    assert not (tmp_path / "work").exists()  # refused before training


@pytest.mark.slow
def test_cli_exit_codes(tmp_path):
    """Trained and replayed each in a fresh process, as recorded runs are; with InfoPro's softmax task
    term, since about 1 in 30 fresh CPU processes computes the contrastive term's first batch in other
    last bits (docs/training.md, replays), which would make this test fail by chance."""
    path, work = tmp_path / "runs" / "tiny", ["--work", str(tmp_path / "work")]
    command = train_command(TrainConfig(**{**TINY.__dict__, "task_loss": "softmax"}), path, "cpu", None)
    trained = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr
    matched = run_cli("experiments.retrain", str(path), *work)
    assert matched.returncode == 0 and "matches the record in every epoch" in matched.stdout, \
        matched.stdout + matched.stderr

    metrics = pd.read_csv(path / "metrics.csv")
    metrics.loc[0, "loss_m1"] *= 1.01
    metrics.to_csv(path / "metrics.csv", index=False)
    differs = run_cli("experiments.retrain", str(path), *work)
    assert differs.returncode == 1 and "epoch 1 loss_m1" in differs.stdout
    assert differs.stderr.strip().startswith("error: 1 of 1 replays differ") and len(differs.stderr.splitlines()) == 1

    (path / "summary.json").write_text("{")
    for bad, message in ((tmp_path, "not a finished run directory"), (path, "summary.json is not valid JSON")):
        result = run_main("experiments.retrain", str(bad), *work)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_gpu_run_without_a_gpu_says_how_to_replay_it(finished, tmp_path, monkeypatch):
    path, _ = finished
    record = json.loads((path / "config.json").read_text())
    record["provenance"]["device"] = "cuda"
    (path / "config.json").write_text(json.dumps(record))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = load_run(path)
    with pytest.raises(InfoProError, match=f"{run.run_id} was trained on one: replay it on a GPU, or with --device cpu"):
        retrain(run, tmp_path / "work", log=quiet)
    assert not (tmp_path / "work").exists()
