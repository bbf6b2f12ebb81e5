"""What a lease's calls carry: the weights read last stay home until the call fits, and come back after."""

import subprocess

import pytest

from conftest import run_main
from experiments.stages import Stage
from experiments.travel import bring_home, call_bytes, leave_home, pack
from infopro.errors import InfoProError

KIB = 1024


def checkout(root, files: dict[str, int]):
    """A git checkout at `root` that commits `files` (path: size in KiB, distinct bytes each) and
    ignores .data/ and .lease/, as this repository does."""
    root.mkdir(exist_ok=True)
    (root / ".gitignore").write_text(".data/\n.lease/\n")
    for number, (name, kib) in enumerate(files.items()):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(bytes([number]) * kib * KIB)
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=root, check=True)
    return root


def stage(name: str, reads: list, done: bool = False) -> Stage:
    return Stage(name, name, lambda: done, lambda left: [], 1, reads=lambda: reads)


WEIGHTS = {"results/runs/early/model.pt": 40, "results/runs/done/model.pt": 30, "results/runs/late/model.pt": 20,
           "results/runs/unread/checkpoint.pt": 10, "results/runs/late/metrics.csv": 50, "code.py": 5}


def plan_of(root):
    """`early` is read first, `late` last; `done`'s stage is done and `unread` has no stage at all."""
    runs = root / "results" / "runs"
    return [stage("first", [runs / "early" / "model.pt"]), stage("finished", [runs / "done" / "model.pt"], done=True),
            stage("last", [runs / "late" / "model.pt"])]


def test_the_count_is_what_git_sends_and_the_carried_paths(tmp_path):
    root = checkout(tmp_path / "repo", {"a.py": 3})
    (root / "new.py").write_bytes(b"x" * KIB)  # untracked, not ignored: it travels
    (root / ".lease").mkdir()
    (root / ".lease" / "state").write_bytes(b"x" * 100 * KIB)  # ignored: it does not
    (root / ".data").mkdir()
    (root / ".data" / "cifar.tar.gz").write_bytes(b"x" * 7 * KIB)
    assert call_bytes(root, []) == 4 * KIB + len(".data/\n.lease/\n")
    assert call_bytes(root, [".data"]) == call_bytes(root, []) + 7 * KIB
    with pytest.raises(InfoProError, match="--carry .cache: no such file or folder"):
        call_bytes(root, [".cache"])


def test_aside_leaves_home_the_weights_read_last_first_until_the_call_fits(tmp_path):
    root = checkout(tmp_path / "repo", WEIGHTS)
    runs, aside = root / "results" / "runs", root / ".lease" / "aside"
    before = {name: (root / name).read_bytes() for name in WEIGHTS}
    lines = []
    # 155 KiB travel with the .gitignore; leaving 45 home takes the unread and the done-stage weights
    # (10 + 30), then the last stage's (20): never the first stage's, nor a file that is not weights.
    moved = leave_home(root, runs, plan_of(root), [], aside, 110 * KIB, log=lines.append)
    assert [path.relative_to(runs).as_posix() for path in moved] == ["done/model.pt", "unread/checkpoint.pt",
                                                                       "late/model.pt"]
    assert call_bytes(root, []) <= 110 * KIB and (runs / "early" / "model.pt").is_file()
    assert (aside / "results/runs/late/model.pt").read_bytes() == before["results/runs/late/model.pt"]
    assert "last reads it" in lines[2] and "no pending stage reads it" in lines[0]
    with pytest.raises(InfoProError, match="still holds the weights of an earlier lease"):
        leave_home(root, runs, plan_of(root), [], aside, 110 * KIB)
    bring_home(root, runs, aside, log=lambda line: None)
    assert {name: (root / name).read_bytes() for name in WEIGHTS} == before and not aside.exists()


def test_aside_moves_nothing_when_the_call_fits_or_cannot_fit(tmp_path):
    root = checkout(tmp_path / "repo", WEIGHTS)
    runs, aside = root / "results" / "runs", root / ".lease" / "aside"
    assert leave_home(root, runs, plan_of(root), [], aside, 200 * KIB, log=lambda line: None) == []
    with pytest.raises(InfoProError, match="over its limit, and leaving every weight home frees only 0.1: carry less"):
        leave_home(root, runs, plan_of(root), [], aside, 50 * KIB)
    assert not aside.exists() and subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                                                 text=True).stdout == ""


def test_home_unpacks_the_lease_puts_the_weights_back_and_drops_finished_runs_checkpoints(tmp_path):
    root = checkout(tmp_path / "repo", {**WEIGHTS, "results/runs/finished/checkpoint.pt": 10,
                                        "results/runs/partial/checkpoint.pt": 10})
    runs, aside = root / "results" / "runs", root / ".lease" / "aside"
    leave_home(root, runs, plan_of(root), [], aside, 140 * KIB, log=lambda line: None)
    # What the machine wrote: `finished` ended (its checkpoint deleted there), `partial` went on.
    lease = tmp_path / "lease"
    for name, text in (("finished/summary.json", "{}"), ("partial/checkpoint.pt", "later")):
        (lease / "results" / "runs" / name).parent.mkdir(parents=True, exist_ok=True)
        (lease / "results" / "runs" / name).write_text(text)
    parts = pack(sorted(path for path in lease.rglob("*") if path.is_file()), lease, tmp_path / "out", 2**20)
    bring_home(root, runs, aside, parts[0].parent, log=lambda line: None)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout
    assert sorted(status.splitlines()) == [" D results/runs/finished/checkpoint.pt",
                                           " M results/runs/partial/checkpoint.pt",
                                           "?? results/runs/finished/summary.json"]


def test_home_keeps_the_lease_copy_of_a_file_that_was_also_set_aside(tmp_path):
    root = checkout(tmp_path / "repo", WEIGHTS)
    runs, aside = root / "results" / "runs", root / ".lease" / "aside"
    leave_home(root, runs, plan_of(root), [], aside, 140 * KIB, log=lambda line: None)
    (runs / "done" / "model.pt").write_text("the lease's")
    with pytest.raises(InfoProError, match="the lease wrote results/runs/done/model.pt, which were set aside"):
        bring_home(root, runs, aside, log=lambda line: None)
    assert (runs / "done" / "model.pt").read_text() == "the lease's"
    assert (aside / "results/runs/done/model.pt").is_file()


@pytest.mark.parametrize("args, message", [
    (["aside", "--limit-mib", "0"], "--limit-mib"),
    (["aside", "--carry", "no-such-folder"], "--carry no-such-folder: no such file or folder"),
    (["home", "--parts", "no-such-folder"], "no-such-folder: no results-*.tar parts here"),
])
def test_the_cli_refuses_bad_input_in_one_line(args, message, monkeypatch):
    monkeypatch.setattr("infopro.records.git_state", lambda: {"git_commit": "a" * 40, "git_dirty": False})
    result = run_main("experiments.lease", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_aside_refuses_uncommitted_code_before_moving_anything(monkeypatch):
    """The job would refuse on the machine, after its start was paid for: say so here."""
    from experiments.lease import ASIDE

    monkeypatch.setattr("infopro.records.git_state", lambda: {"git_commit": "a" * 40, "git_dirty": True})
    result = run_main("experiments.lease", "aside", "--carry", "no-such-folder")
    assert result.returncode == 2 and "commit it first" in result.stderr and not ASIDE.exists()


def test_the_first_call_announces_the_commit_and_reads_the_carried_data():
    from experiments.lease import first_call

    line = first_call("c0ffee", [".data"])
    assert line.startswith("INFOPRO_GIT_COMMIT=c0ffee INFOPRO_GIT_DIRTY=0 ")
    assert "lease start --minutes M --data-root .data && " in line and line.endswith("wait --pack-to $OUT")
