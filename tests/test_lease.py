"""A lease's detached job: started once, outlives its starter, followed and packed by later calls."""

import os
import subprocess
import sys
import tarfile
import time

import pytest

from conftest import REPO
from experiments.lease import follow, job_running, pack_lease, start_job
from infopro.errors import InfoProError


def writer_job(results, seconds: float, code: int = 0, run: str = "r") -> list[str]:
    """A stand-in for `experiments.reproduce`: writes a run's metrics, then works `seconds` more."""
    run = results / "runs" / run
    script = (f"import pathlib, time; run = pathlib.Path({str(run)!r}); run.mkdir(parents=True); "
              f"(run / 'metrics.csv').write_text('epoch\\n1\\n'); print('epoch 1', flush=True); "
              f"time.sleep({seconds}); print('done', flush=True); raise SystemExit({code})")
    return [sys.executable, "-c", script]


def test_a_job_outlives_the_call_that_started_it_and_is_packed_when_followed(tmp_path):
    results, state = tmp_path / "results", tmp_path / ".lease"
    starter = (f"from experiments.lease import start_job; import pathlib; "
               f"start_job({writer_job(results, 2)!r}, pathlib.Path({str(state)!r}), "
               f"pathlib.Path({str(results / 'job.log')!r}))")
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", starter], cwd=REPO, check=True)
    assert time.monotonic() - began < 10 and job_running(state)  # the starter ended; its job did not
    lines = []
    assert follow(state, 0.1, log=lines.append, poll=0.1) is None  # still running: no status yet
    assert follow(state, 30, log=lines.append, poll=0.2) == 0 and not job_running(state)
    assert lines.count("epoch 1") == 1 and lines[-1] == "done"  # each line shown once
    parts = pack_lease(state, results, tmp_path / "out", 2**20, log=lambda line: None)
    with tarfile.open(parts[0]) as tar:
        assert sorted(tar.getnames()) == ["results/job.log", "results/runs/r/metrics.csv"]


def test_a_second_job_is_refused_while_one_runs_and_a_failure_is_its_status(tmp_path):
    results, state = tmp_path / "results", tmp_path / ".lease"
    start_job(writer_job(results, 1.5, code=3), state, results / "job.log")
    with pytest.raises(InfoProError, match="a lease job is running already"):
        start_job(writer_job(results, 0), state, results / "job.log")
    assert follow(state, 30, log=lambda line: None, poll=0.2) == 3


def test_following_without_a_job_says_how_to_start_one(tmp_path):
    with pytest.raises(InfoProError, match="no lease job was started here .*given back.*lease start`"):
        follow(tmp_path / ".lease", 1, log=lambda line: None)


def test_the_job_writes_to_a_copy_of_the_results_that_packs_home_as_results(tmp_path, monkeypatch):
    """A lent machine's later call copies the tree afresh over the tracked files the job wrote to: `start`
    gives the job a copy in the ignored state folder, and `wait` packs that copy's new files, and only
    those, as results/..."""
    from experiments import lease

    results, state = tmp_path / "results", tmp_path / ".lease"
    table = results / "analysis" / "mutual_information.csv"
    table.parent.mkdir(parents=True)
    table.write_text("layer\n1\n")
    os.utime(table, (1e9, 1e9))  # committed long before the lease
    (state / "results" / "stale").mkdir(parents=True)  # an earlier job's copy
    monkeypatch.setattr(lease, "STATE", state)
    monkeypatch.setattr(lease, "JOB_RESULTS", state / "results")
    monkeypatch.setattr(lease, "reproduce_command", lambda minutes, data_root, copy: writer_job(copy, 0))
    lease.main(["start", "--minutes", "1", "--results", str(results)])
    lease.main(["wait", "--seconds", "30", "--pack-to", str(tmp_path / "out")])
    copy = state / "results"
    assert not (copy / "stale").exists() and (copy / "analysis" / "mutual_information.csv").stat().st_mtime == 1e9
    assert not (results / "runs").exists()  # the job never wrote to the tree's results
    with tarfile.open(tmp_path / "out" / "results-1.tar") as tar:
        names = sorted(tar.getnames())
    assert names[0].startswith("results/bench/logs/lease-") and names[1:] == ["results/runs/r/metrics.csv"]


def test_a_second_job_of_the_lease_continues_from_the_first_jobs_copy(tmp_path, monkeypatch):
    """A second `start` on the same machine: the new call has copied the tree's results, as before the lease,
    over the tracked files; the job continues from the first job's copy, and its parts hold both jobs' files.
    A copy from another commit or older than a lent machine's hold is replaced."""
    import json

    from experiments import lease

    results, state = tmp_path / "results", tmp_path / ".lease"
    results.mkdir()
    monkeypatch.setattr(lease, "STATE", state)
    monkeypatch.setattr(lease, "JOB_RESULTS", state / "results")
    for run in ("r", "s"):
        monkeypatch.setattr(lease, "reproduce_command", lambda minutes, data_root, copy: writer_job(copy, 0, run=run))
        lease.main(["start", "--minutes", "1", "--results", str(results)])
        lease.main(["wait", "--seconds", "30", "--pack-to", str(tmp_path / run)])
    with tarfile.open(tmp_path / "s" / "results-1.tar") as tar:
        names = sorted(tar.getnames())
    assert [name for name in names if "/runs/" in name] == ["results/runs/r/metrics.csv", "results/runs/s/metrics.csv"]
    assert sum(name.startswith("results/bench/logs/lease-") for name in names) in (1, 2)  # one a minute
    for stale in ({"commit": "0" * 40}, {"started": time.time() - lease.MACHINE_HOLD_SECONDS - 1}):
        job = json.loads((state / "job.json").read_text())
        (state / "job.json").write_text(json.dumps({**job, **stale}))
        assert lease.earlier_job(state, state / "results") is None
