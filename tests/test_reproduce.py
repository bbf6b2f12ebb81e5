"""The GPU plan: stages skip what exists, respect the budget, survive a failing stage; its CLI."""

import importlib
import sys

import pandas as pd
import pytest

from conftest import REPO, run_cli
from infopro.errors import InfoProError
from infopro.records import git_state
from infopro.reproduce import Stage, best_jobs, check_code_is_named, run_stages, stages


def python_stage(name: str, code: str, done=lambda: False, minutes: float = 0) -> Stage:
    return Stage(name, name, done, lambda left: [sys.executable, "-c", code], minutes)


def test_stages_run_in_order_skip_done_and_too_long_ones_and_survive_a_failure(tmp_path):
    marker = tmp_path / "ran"
    plan = [python_stage("finished", "raise SystemExit('must not run')", done=lambda: True),
            python_stage("broken", "raise SystemExit(1)"),
            python_stage("too-long", "raise SystemExit('must not run')", minutes=60),
            python_stage("works", f"open({str(marker)!r}, 'w').write('ok')")]
    lines = []
    assert run_stages(plan, minutes=5, log=lines.append) == ["broken"]
    assert marker.read_text() == "ok"
    assert [line.split("]")[0].lstrip("[") for line in lines] == \
        ["finished", "broken", "broken", "too-long", "works", "works"]
    assert "done already" in lines[0] and "failed" in lines[2] and "skipped" in lines[3] and "finished" in lines[5]


def test_plan_counts_only_gpu_results_and_gives_the_grid_its_measured_jobs_and_time(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    plan = {stage.name: stage for stage in stages(tmp_path, ".data")}
    assert list(plan) == ["table3", "module-parallel", "max-batch", "grid-jobs", "table2"]
    assert not any(stage.done() for stage in plan.values())
    for name in ("resnet110-b1024-fp32-cpu.csv", "pipeline-resnet32-b1024-cpu.csv"):
        (bench / name).touch()
    assert not plan["table3"].done()  # CPU measurements do not count
    for name in ("resnet110-b1024-fp32-nvidia-h100.csv", "pipeline-resnet32-b1024-nvidia-h100.csv"):
        (bench / name).touch()
    assert plan["table3"].done()
    assert best_jobs(bench) == 1
    pd.DataFrame({"jobs": [1, 2, 4], "best": [False, True, False]}).to_csv(
        bench / "grid-jobs-table2-resnet32-nvidia-h100.csv", index=False)
    command = plan["table2"].command(12.5)
    assert command[command.index("--jobs") + 1] == "2" and command[command.index("--time-budget") + 1] == "12.5"
    assert command[command.index("--dataset") + 1] == "cifar10-jpeg" and ".data" in command


def test_cli_lists_the_plan_and_refuses_to_run_without_budget_or_gpu(tmp_path):
    result = run_cli("experiments.reproduce", "--plan", "--results", str(tmp_path))
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 5
    assert all(line.startswith("to do") for line in result.stdout.splitlines())
    for args, message in (([], "--time-budget"), (["--time-budget", "5"], "no CUDA device")):
        result = run_cli("experiments.reproduce", *args, "--results", str(tmp_path))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_every_stage_command_is_accepted_by_its_entry_point(tmp_path):
    """A typo in a stage would cost a GPU lease: each command line must parse."""
    for stage in stages(tmp_path, ".data"):
        command = stage.command(10.0)
        assert command[:2] == [sys.executable, "-m"]
        importlib.import_module(command[2]).parse_args(command[3:])


def test_a_copy_without_history_names_its_code_as_announced_and_gpu_work_refuses_it_otherwise(tmp_path, monkeypatch):
    """A lent GPU gets the tree without .git: its results must still name their commit, as a boolean flag."""
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-history"))  # git fails here, as on such a machine
    for name in ("INFOPRO_GIT_COMMIT", "INFOPRO_GIT_DIRTY"):
        monkeypatch.delenv(name, raising=False)
    assert git_state(tmp_path) == {"git_commit": "unknown", "git_dirty": "unknown"}
    with pytest.raises(InfoProError, match="INFOPRO_GIT_COMMIT"):
        check_code_is_named(git_state(tmp_path))
    monkeypatch.setenv("INFOPRO_GIT_COMMIT", "0123456789abcdef")
    monkeypatch.setenv("INFOPRO_GIT_DIRTY", "0")
    assert git_state(tmp_path) == {"git_commit": "0123456789abcdef", "git_dirty": False}
    check_code_is_named(git_state(tmp_path))
    monkeypatch.setenv("INFOPRO_GIT_DIRTY", "1")
    with pytest.raises(InfoProError, match="commit it first"):
        check_code_is_named(git_state(tmp_path))
    monkeypatch.setenv("INFOPRO_GIT_DIRTY", "maybe")
    assert git_state(tmp_path)["git_dirty"] == "unknown"


def test_an_announced_commit_wins_over_a_stale_history(monkeypatch):
    """The first H100 lease received a .git of an earlier commit: git named that commit, dirty."""
    monkeypatch.setenv("INFOPRO_GIT_COMMIT", "0123456789abcdef")
    monkeypatch.setenv("INFOPRO_GIT_DIRTY", "0")
    assert git_state(REPO) == {"git_commit": "0123456789abcdef", "git_dirty": False}
    monkeypatch.delenv("INFOPRO_GIT_COMMIT")
    assert git_state(REPO)["git_commit"] != "0123456789abcdef"
