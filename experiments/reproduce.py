"""Every result of this repository that needs a GPU, in order of value, within a time budget; call again to continue.

    python -m experiments.reproduce --time-budget 25 --data-root .data   # one GPU lease
    python -m experiments.reproduce --plan                                # which stages are done, the grid's time left
    python -m experiments.reproduce --time-budget 8 --pack-to $OUT ...    # then pack what this call wrote
    INFOPRO_GIT_COMMIT=<sha> INFOPRO_GIT_DIRTY=0 python -m experiments.reproduce ...  # a copy without .git (or a stale one)

Stages (experiments/stages.py), each skipped once its results exist, a failing one reported while
the next runs: epoch-bench (seconds per epoch, eager and compiled: the grids train in the faster
mode); table3, module-parallel, max-batch, profile, profile-resnet32 and retime (Table 3,
fig_memory and the benchmark CSVs; 0.3 to 8.5 min each on one H100, results/bench/logs/);
remainder-ceiling, remainder-steps (eager against CUDA-graphed steps of a pass) and one
remainder:<network> stage per seed-0 network for its key layer points (fig10 and the information
plane in the paper's units; each call trains the layer points that fit its minutes, at the pace
timed on that GPU in the faster step mode): E2E and greedy SL's first, the others' after
table2-unfinished, then one remainder-between:<network> stage each for the rest; grid-jobs (how
many trainings at once fill the GPU, counted while all train); dgl-seed0, table2-unfinished,
table2 and dgl (Table 2 and fig7 on cifar10-jpeg: 160-epoch runs, 9 to 40 min each with four
sharing an H100, resumed across calls; `make status` adds up what is left and its GPU time);
bf16-twins (E2E and InfoPro (Contrast) K = 4 in bf16, beside their fp32 seeds, before bf16 trains
any grid); table3-compiled (Table 3's InfoPro* and E2E steps with compiled modules). Each call ends
with the share of it spent in training epochs and remainder passes and the size of inductor's compile
cache. fig8 and the 1c2f estimates follow on a CPU from `make probes mutual-info figures tables`.
"""

import getpass
import os
import tempfile
import time
from pathlib import Path

from experiments.stages import check_code_is_named, run_stages, stages
from experiments.travel import pack, results_since
from infopro.cli import ArgumentParser, positive, run
from infopro.device import resolve_device
from infopro.errors import InfoProError
from infopro.paces import epoch_intervals, shared_seconds
from infopro.records import check_writable, device_slug, git_state, read_table


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m experiments.reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--time-budget", type=positive, metavar="MIN",
                   help="start nothing that would not end within MIN minutes")
    p.add_argument("--data-root", help="folder or archive holding the cifar10-jpeg copy")
    p.add_argument("--results", default="results", help="the results folder (bench/ and runs/ inside)")
    p.add_argument("--plan", action="store_true", help="list the stages, done or to do, and exit")
    p.add_argument("--pack-to", metavar="DIR", help="afterwards, pack every results file this call wrote "
                                                    "(checkpoints included) into tar parts in DIR")
    p.add_argument("--pack-mib", type=positive, default=15, metavar="MIB", help="largest part (default: 15 MiB)")
    return p


def print_plan(plan) -> None:
    """`--plan`: each stage, done or to do, and its progress lines beneath it."""
    width = max(len(stage.name) for stage in plan)
    for stage in plan:
        print(f"{'done' if stage.done() else 'to do':<6} {stage.name:<{width}} {stage.description}")
        for line in stage.progress():
            print(f"{'':<{width + 7}} {line}")


def main(argv=None):
    args = parser().parse_args(argv)
    if args.plan:
        print_plan(stages(Path(args.results), args.data_root))
        return
    if args.time_budget is None:
        raise InfoProError("give --time-budget MIN (the minutes this GPU is yours), or --plan")
    gpu = device_slug(resolve_device("cuda", remedy="these stages are GPU work (`--plan` lists them, done or to do)"))
    plan = stages(Path(args.results), args.data_root, gpu)
    check_code_is_named(git_state())
    if args.pack_to:  # a lease's results that cannot be packed are lost with the machine
        check_writable(args.pack_to)
    began, results = time.time(), Path(args.results).resolve()
    estimates = results / "analysis" / "mutual_information.csv"
    passes_before = remainder_passes(estimates)

    def pack_what_this_call_made():
        """Each stage's results come home even if a later stage is killed with the call."""
        parts = pack(results_since(results, began), results.parent, Path(args.pack_to), int(args.pack_mib * 2**20))
        print(f"packed {len(parts)} part{'s' * (len(parts) != 1)} into {args.pack_to}", flush=True)

    failed = run_stages(plan, args.time_budget, after=pack_what_this_call_made if args.pack_to else lambda: None)
    for stage in plan:
        for line in stage.progress():
            print(f"[{stage.name}] {line}")
    print(training_share_line(results / "runs", began, time.time(), seconds_of_new_passes(estimates, passes_before)))
    print(inductor_cache_line())
    if failed:
        raise InfoProError(f"stages that failed: {', '.join(failed)} (their output is above)")


def training_share_line(runs: Path, began: float, ended: float, estimating: float = 0.0) -> str:
    """How much of a call's time some training epoch was running (`metrics.csv`'s `ended_at` and
    `epoch_seconds`, evaluation excluded; runs side by side count once), and how much the remainder
    passes took (`estimating` seconds: they train too, in stages of their own): the share of a lease
    that trains, which everything else in it (start-up, compiling, measurements, packing) eats into."""
    intervals = [(max(start, began), end) for path in runs.glob("*/metrics.csv")
                 for start, end in epoch_intervals(path.parent)]
    trained = sum(shared_seconds(intervals))  # the shares of a GPU's time add up to the time covered
    spent = max(ended - began, 1e-9)
    return (f"training epochs ran for {trained / 60:.1f} and remainder passes for {estimating / 60:.1f} of this "
            f"call's {spent / 60:.1f} min ({100 * (trained + estimating) / spent:.0f}%)")


def remainder_passes(table: Path) -> dict[tuple, float]:
    """{(run id, pass seconds to the µs): seconds} of each remainder pass with rows in `table` (a pass's rows,
    one per layer point, share its run and `pass_seconds`). Rounded, because pandas' CSV parser may read a
    float a unit in the last place off, and each pass rewrites the whole file."""
    if not table.is_file():
        return {}
    rows = read_table(table, "restore it from git", ("run_id",))
    if "pass_seconds" not in rows:
        return {}
    timed = rows.loc[rows["pass_seconds"].notna(), ["run_id", "pass_seconds"]]
    return {(run_id, round(seconds, 6)): seconds for run_id, seconds in timed.itertuples(index=False)}


def seconds_of_new_passes(table: Path, before: dict[tuple, float]) -> float:
    """The seconds of the remainder passes in `table` that `before` (`remainder_passes`) did not hold."""
    return sum(seconds for key, seconds in remainder_passes(table).items() if key not in before)


def inductor_cache_line() -> str:
    """What inductor's compile cache holds after a call. It lasts as long as the machine, and a cold compile
    costs a compiled training minutes per configuration: its size says whether carrying it to the next
    lease would fit what a call may carry (64 MiB with the tree)."""
    folder = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                  or Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
    files = [path for path in folder.rglob("*") if path.is_file()] if folder.is_dir() else []
    mib = sum(path.stat().st_size for path in files) / 2**20
    return f"inductor's cache: {mib:.1f} MiB in {len(files)} files ({folder})"


if __name__ == "__main__":
    run(main)
