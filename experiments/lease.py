"""One GPU lease, one detached job: start the lease's work once, then wait on it and bring its results home.

    python -m experiments.lease aside --carry .data                       # here: fit the tree to a call
    python -m experiments.lease start --minutes 11 --data-root .data &&    # the first call: starts it,
        python -m experiments.lease wait --seconds 540 --pack-to $OUT     # then follows it
    python -m experiments.lease wait --seconds 540 --pack-to $OUT         # each later call, back to back
    python -m experiments.lease home --parts FOLDER                       # here: the last call's parts

A lent machine takes one command at a time (at most 10 minutes), is given back 30 s after a command
ends, and only what a command leaves under $OUT comes back. Run in the foreground, the lease's work
(`experiments.reproduce`) would have to be cut into calls, each restarting its trainings from packed
checkpoints. `start` starts it instead in a process session of its own, which outlives the call, with a
time budget that ends it, at an epoch boundary, before the lease does. The job reads and writes a copy
of the results folder under .lease/, which git ignores, since each call copies the tree afresh over the
tracked files the job has written to; a second `start` on the same machine continues from the first
job's copy. Each `wait` prints the job's new log lines while it runs, and at its end packs every results
file the lease has written so far (`experiments.travel.pack`: checkpoints included, never a half-written
file) into $OUT, to unpack as results/. The next call must come within the machine's idle time, or the
job is lost with it. `aside` and `home` run here, around the lease (experiments.travel): the weights the
lease reads last stay here while it runs, so that the tree and the data fit what a call carries. A lent
machine may receive a stale `.git` with the tree, so prefix `start` with `INFOPRO_GIT_COMMIT=<sha>
INFOPRO_GIT_DIRTY=0` (`git rev-parse HEAD` here): the results then name the code that was sent.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from experiments.stages import check_code_is_named, stages
from experiments.travel import bring_home, leave_home, pack, results_since
from infopro.cli import ArgumentParser, positive, run
from infopro.errors import InfoProError
from infopro.records import REPO_ROOT, check_writable, git_state, write_json

STATE = REPO_ROOT / ".lease"      # the job's pid, start, log and exit status (git ignores it)
ASIDE = STATE / "aside"           # the weights a lease leaves home (`aside`), until `home`
JOB_RESULTS = STATE / "results"   # the job's copy of the results folder (`copy_for_job`)
RETURNED_PARTS = 8                # a command brings back at most 8 files of 16 MiB
PROGRESS_SECONDS = 60
STARTUP_SECONDS = 10  # `start` waits this long for a job that fails at once
MACHINE_HOLD_SECONDS = 30 * 60  # a lent machine goes back after this long, its .lease/ with it


def start_job(command: list[str], state: Path, log: Path, since: float | None = None) -> dict:
    """Start `command` in the repository root in a session of its own (it survives the call that starts it),
    its output to `log`, its exit status to `state`/exit when it ends; refuse while another job runs.
    `since`: the start of the earlier job it continues, so that packing takes that job's files too."""
    refuse_while_running(state)
    state.mkdir(parents=True, exist_ok=True)
    for previous in ("exit", "shown"):
        (state / previous).unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    shell = f"{shlex.join(command)}; echo $? > {shlex.quote(str(state / 'exit'))}"
    started = time.time()  # before the job can write anything: packing takes every file since
    with open(log, "a") as output:
        process = subprocess.Popen(["sh", "-c", shell], cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    job = {"pid": process.pid, "started": since or started, "log": str(log), "command": command,
           "commit": git_state()["git_commit"]}
    write_json(state / "job.json", job)
    return job


def refuse_while_running(state: Path) -> None:
    if job_running(state):
        raise InfoProError(f"a lease job is running already (pid {read_state(state)['pid']}); "
                           "`python -m experiments.lease wait` follows it")


def copy_for_job(results: Path, copy: Path) -> Path:
    """`results` copied to `copy` (a folder named results, in one git ignores), file times kept, for the job
    to read and write.

    Why: each call of a lent machine copies the working tree afresh, tracked files included, over what the
    job still running there wrote to them since the last call (a CSV it added rows to); a folder git
    ignores is kept between calls. Packed relative to its parent, the copy's files come home as results/."""
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(results, copy, symlinks=True)
    return copy


def earlier_job(state: Path, copy: Path) -> dict | None:
    """The ended job of this lease whose copy of the results a new job continues from: one on this machine,
    from the same commit, started within the time a lent machine is held. None: start from a fresh copy.

    Why: a new call copies the tree's results, as they were before the lease, over the tracked files the
    earlier job added rows to, so a job started from that copy would repeat the earlier job's estimates
    and lose its rows from the last call's parts. The age bound keeps a copy from a past lease on one's own
    machine, whose results have come home and moved on since, from standing in for the tree's."""
    if not copy.is_dir() or not (state / "job.json").is_file():
        return None
    job = read_state(state)
    same_lease = time.time() - job["started"] < MACHINE_HOLD_SECONDS
    return job if same_lease and job.get("commit") == git_state()["git_commit"] else None


def read_state(state: Path) -> dict:
    if not (state / "job.json").is_file():
        raise InfoProError("no lease job was started here (a machine given back between calls takes its job, and "
                           "what the job wrote since the last `wait`, with it); `python -m experiments.lease start` "
                           "starts one")
    return json.loads((state / "job.json").read_text())


def exit_status(state: Path) -> int | None:
    """The job's exit status once it has ended (None while it runs)."""
    written = (state / "exit").read_text().strip() if (state / "exit").is_file() else ""
    return int(written) if written else None


def job_running(state: Path) -> bool:
    if not (state / "job.json").is_file() or exit_status(state) is not None:
        return False
    try:
        os.kill(read_state(state)["pid"], 0)
    except ProcessLookupError:
        return False  # ended without writing its status: killed with its session
    return True


def follow(state: Path, seconds: float, log=print, poll: float = PROGRESS_SECONDS) -> int | None:
    """Print the job's log lines not shown before (by this call or an earlier one) every `poll` seconds for
    up to `seconds`, or until it ends; returns its exit status (None: still running)."""
    job, seen = read_state(state), state / "shown"
    deadline = time.monotonic() + seconds
    while True:
        text = Path(job["log"]).read_text() if Path(job["log"]).is_file() else ""
        lines = text.split("\n")[:-1]  # whole lines only: the last may be half written
        shown = int(seen.read_text()) if seen.is_file() else 0
        for line in lines[shown:]:
            log(line)
        seen.write_text(str(len(lines)))
        running = job_running(state)
        if not running or time.monotonic() >= deadline:
            return None if running else exit_status(state)
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.1)))


def pack_lease(state: Path, results: Path, out: Path, max_bytes: int, log=print) -> list[Path]:
    """Every results file written since the job started, in tar parts under `out`; says if some would not
    come back from the call (more parts than it returns)."""
    parts = pack(results_since(results, read_state(state)["started"]), results.parent, out, max_bytes)
    log(f"packed {len(parts)} part{'s' * (len(parts) != 1)} into {out}")
    if len(parts) > RETURNED_PARTS:
        log(f"warning: only {RETURNED_PARTS} files come back from a call; parts {RETURNED_PARTS + 1} to "
            f"{len(parts)} stay on the machine")
    return parts


def reproduce_command(minutes: float, data_root: str | None, results: Path) -> list[str]:
    return [sys.executable, "-u", "-m", "experiments.reproduce", "--time-budget", f"{minutes:g}",
            "--results", str(results)] + (["--data-root", str(Path(data_root).resolve())] if data_root else [])


def first_call(commit: str, carry: list[str]) -> str:
    """The first call's command line: the commit announced (the machine's `.git` may be stale), the data
    read from the first carried path."""
    data = f" --data-root {carry[0]}" if carry else ""
    return (f"INFOPRO_GIT_COMMIT={commit} INFOPRO_GIT_DIRTY=0 PYTHONPATH=. python -m experiments.lease start "
            f"--minutes M{data} && PYTHONPATH=. python -m experiments.lease wait --pack-to $OUT")


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.lease", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="action", required=True)
    start = commands.add_parser("start", help="start the lease's work detached and return")
    start.add_argument("--minutes", type=positive, required=True,
                       help="the job's time budget: end it this long before the lease's device time does")
    start.add_argument("--data-root", help="folder or archive holding the cifar10-jpeg copy")
    wait = commands.add_parser("wait", help="follow the job, then pack what the lease wrote")
    wait.add_argument("--seconds", type=positive, default=540, help="return after this long (default: 540)")
    wait.add_argument("--pack-to", metavar="DIR", help="pack every results file the lease wrote into DIR")
    wait.add_argument("--pack-mib", type=positive, default=15, metavar="MIB", help="largest part (default: 15 MiB)")
    aside = commands.add_parser("aside", help="here, before a lease: leave home the weights it reads last, "
                                              "until the tree and --carry fit what a call carries")
    aside.add_argument("--carry", nargs="+", default=[], metavar="PATH", help="the paths the calls carry (.data)")
    aside.add_argument("--limit-mib", type=positive, default=63, metavar="MIB",
                       help="fit within this (default: 63, a MiB short of the 64 a call carries)")
    home = commands.add_parser("home", help="here, after a lease: unpack its last call's parts, put the weights "
                                            "back, remove the checkpoints of runs that finished")
    home.add_argument("--parts", metavar="FOLDER", help="the folder the last call's results-*.tar came back to")
    for command in (start, aside, home):
        command.add_argument("--results", default="results", help="the results folder (default: results)")
    return p.parse_args(argv)


def before_lease(args) -> None:
    """`aside`: refuse uncommitted code, fit the tree to a call, print the first call."""
    results, state = Path(args.results).resolve(), git_state()
    check_code_is_named(state)  # else the job would refuse on the machine, its start already paid
    leave_home(REPO_ROOT, results / "runs", stages(results, None), args.carry, ASIDE, int(args.limit_mib * 2**20))
    print(f"the first call (M: its device minutes less about 4), carrying {' '.join(args.carry) or 'nothing'}:\n"
          f"  {first_call(state['git_commit'], args.carry)}")


def after_lease(args) -> None:
    """`home`: unpack the last call's parts and put the weights back."""
    bring_home(REPO_ROOT, Path(args.results).resolve() / "runs", ASIDE, Path(args.parts) if args.parts else None)
    print("next: commit the results (`git add -A results`), then on a CPU `make probes mutual-info test-predictions "
          "DATA_ROOT=.data` for new weights and `make tables figures readme` (docs/gpu-work.md)")


def start_lease(args) -> None:
    """`start`: the lease's job, detached, on a copy of the results folder; fails at once if the job does."""
    refuse_while_running(STATE)  # before its copy is replaced
    earlier = earlier_job(STATE, JOB_RESULTS)
    results = JOB_RESULTS if earlier else copy_for_job(Path(args.results).resolve(), JOB_RESULTS)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
    job = start_job(reproduce_command(args.minutes, args.data_root, results), STATE,
                    results / "bench" / "logs" / f"lease-{stamp}.log", since=earlier and earlier["started"])
    continues = " from the earlier job's results" if earlier else ""
    print(f"started the lease's job{continues} (pid {job['pid']}, {args.minutes:g} min); its log: {job['log']}")
    status = follow(STATE, STARTUP_SECONDS, poll=1)  # a job refused at once (no GPU, uncommitted code)
    if status:
        raise InfoProError(f"the lease's job ended at once with exit status {status} (its log is above)")


def wait_on_lease(args) -> None:
    """`wait`: follow the job, pack what it wrote to its copy of the results, say whether it runs on."""
    if args.pack_to:
        check_writable(args.pack_to)
    status = follow(STATE, args.seconds)
    if args.pack_to:
        pack_lease(STATE, JOB_RESULTS, Path(args.pack_to), int(args.pack_mib * 2**20))
    if status is None:
        print("the job runs on: call `wait` again within the machine's idle time")
    elif status:
        raise InfoProError(f"the lease's job ended with exit status {status} (its log is above)")
    else:
        print("the lease's job has ended")


def main(argv=None):
    args = parse_args(argv)
    actions = {"aside": before_lease, "home": after_lease, "start": start_lease, "wait": wait_on_lease}
    actions[args.action](args)


if __name__ == "__main__":
    run(main)
