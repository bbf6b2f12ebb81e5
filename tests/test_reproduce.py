"""The GPU plan: stages skip what exists, respect the budget, survive a failing stage; its CLI."""

import importlib
import os
import shutil
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import REPO, run_main
from infopro.bench_methods import default_methods
from infopro.errors import InfoProError
from infopro.records import git_state
from experiments.measured import best_jobs
from experiments.stages import Stage, check_code_is_named, run_stages, stages
from experiments.travel import pack, results_since


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


def test_a_stage_is_sized_when_it_comes_up_from_what_earlier_stages_measured(tmp_path):
    measured = tmp_path / "measured"
    plan = [python_stage("measure", f"open({str(measured)!r}, 'w').write('ok')"),
            Stage("sized", "sized", lambda: False, lambda left: [sys.executable, "-c", "raise SystemExit(1)"],
                  minutes=lambda: 60 if measured.exists() else 0)]
    lines = []
    assert run_stages(plan, minutes=5, log=lines.append) == []
    assert "skipped" in lines[-1] and "it needs about 60" in lines[-1]


def test_a_remainder_pass_needs_what_its_gpu_measured_at_the_chosen_budget(tmp_path):
    """Nothing to plan before a budget is chosen (the command refuses at once); then the guess until a pass
    was timed on that GPU; then the ceiling's rate per unit of point work; then the slowest network
    pass's: each scaled to the points' work and the budget the ceiling chose."""
    from experiments.remainder_plan import (GUESS_SECONDS_PER_WORK, REMAINDER_MARGIN, REMAINDER_START_MINUTES,
                                            point_work, remainder_minutes)
    from experiments.stages import REMAINDER_REFERENCE

    mi, ceilings = tmp_path / "mutual_information.csv", tmp_path / "remainder_ceiling.csv"
    bench = tmp_path / "bench"
    h100, every = "nvidia-h100-80gb-hbm3", list(range(1, 17))

    def minutes(gpu, points):
        return remainder_minutes(mi, ceilings, bench, gpu, points, REMAINDER_REFERENCE)

    assert minutes(h100, every) == REMAINDER_START_MINUTES  # no budget: refused at once
    ceiling = dict(run_id=REMAINDER_REFERENCE, layer=0, estimator="remainder", rem_epochs=30, within_2_points=True,
                   pass_points=1, pass_seconds=60.0, analysis_device="NVIDIA H100 80GB HBM3", rem_batch_size=512,
                   rem_lr=0.4, rem_warmup_epochs=2, rem_momentum=0.9, rem_weight_decay=5e-4, rem_precision="bf16",
                   rem_seed=0, ixy_paper=0.88, network_accuracy=0.89)
    another = ceiling | dict(run_id="a-fixture-network", rem_epochs=12, pass_seconds=24.0)  # another recipe's budget
    pd.DataFrame([another]).to_csv(ceilings, index=False)
    assert minutes(h100, every) == REMAINDER_START_MINUTES
    pd.DataFrame([another, ceiling]).to_csv(ceilings, index=False)
    # Nothing timed on that GPU: the guess.
    guessed = REMAINDER_MARGIN * GUESS_SECONDS_PER_WORK * 30 * 136 / 60 + REMAINDER_START_MINUTES
    assert minutes(None, every) == minutes("nvidia-a100", every)
    assert minutes("nvidia-a100", every) == pytest.approx(guessed)
    # The ceiling: 2 s an epoch for point 0's 17 units; sixteen points are 136 units, eight ceilings.
    assert sum(map(point_work, every)) == 8 * point_work(0)
    assert minutes(h100, every) == pytest.approx(REMAINDER_MARGIN * 8 * 2.0 * 30 / 60 + REMAINDER_START_MINUTES)
    assert minutes(h100, [16]) == pytest.approx(REMAINDER_MARGIN * 2.0 / 17 * 30 / 60 + REMAINDER_START_MINUTES)
    greedy = [dict(run_id="greedy", layer=layer, estimator="remainder", rem_epochs=10, pass_points=3,
                   pass_seconds=90.0, analysis_device="NVIDIA H100 80GB HBM3") for layer in (1, 2, 3)]
    others = [dict(run_id="e2e", layer=1, estimator="remainder", rem_epochs=30, pass_points=1, pass_seconds=9000.0,
                   analysis_device="Intel Xeon"),
              dict(run_id="e2e", layer=1, estimator="1c2f", analysis_device="NVIDIA H100 80GB HBM3")]
    pd.DataFrame(greedy + others).to_csv(mi, index=False)
    rate = 90.0 / 10 / (16 + 15 + 14)  # the H100 pass over points 1 to 3, per epoch and unit of work
    assert minutes(h100, [4, 5]) == pytest.approx(REMAINDER_MARGIN * rate * 25 * 30 / 60 + REMAINDER_START_MINUTES)
    # Once graphed steps measured faster there, passes run graphed: planned at the measurement's rate (its
    # pass over sixteen points: 136 units) until a graphed network pass is timed; eager passes no longer count.
    bench.mkdir()
    pd.DataFrame([dict(step="eager", points=16, epoch_seconds=40.8, agrees_with_eager=True),
                  dict(step="graphed", points=16, epoch_seconds=13.6, agrees_with_eager=True)]).to_csv(
        bench / f"remainder-steps-{h100}.csv", index=False)
    assert minutes(h100, [4, 5]) == pytest.approx(REMAINDER_MARGIN * 0.1 * 25 * 30 / 60 + REMAINDER_START_MINUTES)
    graphed = [row | dict(run_id="greedy-graphed", pass_seconds=36.0, pass_step="graphed") for row in greedy]
    pd.DataFrame(greedy + others + graphed).to_csv(mi, index=False)
    assert minutes(h100, [4, 5]) == pytest.approx(
        REMAINDER_MARGIN * 0.4 * rate * 25 * 30 / 60 + REMAINDER_START_MINUTES)


def test_a_budget_check_plans_the_ceiling_until_its_recipe_has_one_at_that_budget(tmp_path):
    """The ceiling never reads a network's features: once one of the recipe's is at the longer budget, measured
    against any network, a budget check plans its layer points alone; another recipe's ceiling does not count."""
    from experiments.remainder_plan import longer_ceiling_measured, remainder_minutes
    from experiments.stages import BUDGET_LAYERS, REMAINDER_REFERENCE

    infopro = "cifar10-jpeg-resnet32-infopro-contrast-K2-s0"
    for run_id in (REMAINDER_REFERENCE, infopro):
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "model.pt").touch()
    (tmp_path / "analysis").mkdir()
    ceilings = tmp_path / "analysis" / "remainder_ceiling.csv"
    chosen = dict(run_id=REMAINDER_REFERENCE, arch="resnet32", recipe="paper", layer=0, rem_epochs=30,
                  within_2_points=True, rem_batch_size=512, rem_lr=0.4, rem_warmup_epochs=2, rem_momentum=0.9,
                  rem_weight_decay=5e-4, rem_precision="bf16", rem_seed=0, ixy_paper=0.88, network_accuracy=0.89)
    longer = [chosen | dict(run_id="a-fixture-network", recipe="a CPU fixture", rem_epochs=60),
              chosen | dict(run_id=infopro, rem_epochs=60)]
    plan = {stage.name: stage for stage in stages(tmp_path, ".data", gpu="nvidia-a100")}
    plan = plan["remainder-budget:infopro-contrast-K2"]

    def planned(rows) -> tuple[bool, float]:
        pd.DataFrame(rows).to_csv(ceilings, index=False)
        return longer_ceiling_measured(ceilings, REMAINDER_REFERENCE, 2), plan.minutes_needed()

    def minutes(points):
        return remainder_minutes(tmp_path / "mi.csv", ceilings, tmp_path / "bench", "nvidia-a100", points,
                                 REMAINDER_REFERENCE, 2)

    with_ceiling = planned([chosen])
    assert with_ceiling == planned([chosen, longer[0]]) == (False, minutes([0]) + minutes(list(BUDGET_LAYERS)))
    assert planned([chosen, *longer]) == (True, minutes(list(BUDGET_LAYERS)))


def test_a_remainder_pass_is_planned_at_a_fixed_cost_an_epoch_plus_its_work(tmp_path):
    """Passes of several sizes on one GPU: each epoch costs a fixed part (the fitted intercept) plus a rate per
    unit of point work, that rate the most any pass took beyond the fixed part; so no timed pass lies above
    its plan, and a long pass is planned for less than at the short passes' rate per unit."""
    from experiments.remainder_plan import pass_pace, point_work

    mi, h200 = tmp_path / "mutual_information.csv", "nvidia-h200"

    def rows(run_id, layers, seconds):
        return [dict(run_id=run_id, layer=layer, estimator="remainder", rem_epochs=30, pass_seconds=seconds,
                     pass_step="graphed", analysis_device="NVIDIA H200") for layer in layers]

    passes = {"e2e": (range(11, 17), 45.0), "greedy": ((1, 4, 8, 12, 16), 73.5), "e2e-early": (range(1, 11), 159.0)}
    pd.DataFrame([row for run_id, (layers, s) in passes.items() for row in rows(run_id, layers, s)]).to_csv(
        mi, index=False)
    fixed, per_unit = pass_pace(mi, h200, "graphed")
    works = {run_id: sum(map(point_work, layers)) for run_id, (layers, _) in passes.items()}
    assert 0 < fixed < 45.0 / 30
    for run_id, (_, seconds) in passes.items():
        assert fixed + per_unit * works[run_id] >= seconds / 30 - 1e-9
    assert any(fixed + per_unit * works[run_id] == pytest.approx(s / 30) for run_id, (_, s) in passes.items())
    shortest_rate = 45.0 / 30 / works["e2e"]
    assert fixed + per_unit * 136 < 0.8 * shortest_rate * 136  # sixteen points: far under the short pass's rate
    assert pass_pace(mi, h200, "eager") is None and pass_pace(mi, "nvidia-h100", "graphed") is None
    pd.DataFrame(rows("e2e", range(11, 17), 45.0)).to_csv(mi, index=False)  # one size of pass: no intercept
    assert pass_pace(mi, h200, "graphed") == pytest.approx((0.0, shortest_rate))


def test_the_remainder_passes_run_graphed_once_their_gpu_measured_it_faster_and_agreeing(tmp_path):
    from experiments.remainder_plan import measured_pace
    from experiments.stages import REMAINDER_REFERENCE

    (tmp_path / "runs" / REMAINDER_REFERENCE).mkdir(parents=True)
    (tmp_path / "runs" / REMAINDER_REFERENCE / "model.pt").touch()
    (tmp_path / "bench").mkdir()
    measured = pd.DataFrame([dict(step="eager", points=16, epoch_seconds=40.0, agrees_with_eager=True),
                             dict(step="graphed", points=16, epoch_seconds=14.0, agrees_with_eager=False)])
    for agrees, step in ((False, "eager"), (True, "graphed")):
        measured.assign(agrees_with_eager=[True, agrees]).to_csv(tmp_path / "bench" / "remainder-steps-nvidia-h200.csv",
                                                                 index=False)
        plan = {stage.name: stage for stage in stages(tmp_path, ".data", "nvidia-h200")}
        layers = plan["remainder:e2e-K1"].command(5.0)
        assert plan["remainder-steps"].done() and layers[layers.index("--step") + 1] == step
    assert not {stage.name: stage for stage in stages(tmp_path, ".data", "nvidia-h100")}["remainder-steps"].done()
    failed = measured.assign(epoch_seconds=[40.0, float("nan")], error=[None, "RuntimeError: capture refused"])
    failed.to_csv(tmp_path / "bench" / "remainder-steps-nvidia-h200.csv", index=False)
    assert measured_pace(tmp_path / "bench", "nvidia-h200", "graphed") is None  # a failed mode has no pace
    assert measured_pace(tmp_path / "bench", "nvidia-h200", "eager") == pytest.approx((0.0, 40.0 / 136))


def test_a_remainder_stage_estimates_the_points_that_fit_and_continues_where_it_stopped(tmp_path):
    """Each call trains the longest start of the missing points that fits the minutes left (at least
    one); the rows written are not asked for again."""
    from experiments.remainder_plan import REMAINDER_START_MINUTES, points_that_fit
    from experiments.stages import REMAINDER_REFERENCE

    work = {layer: 17 - layer for layer in range(1, 17)}
    assert points_that_fit([1, 2, 3, 4], lambda points: sum(work[p] for p in points), 45.5) == [1, 2, 3]
    assert points_that_fit([1, 2, 3, 4], lambda points: sum(work[p] for p in points), 1) == [1]
    assert points_that_fit([9, 16], lambda points: 0.5, 1) == [9, 16]
    run_id = "cifar10-jpeg-resnet32-e2e-K1-s0"
    (tmp_path / "runs" / run_id).mkdir(parents=True)
    (tmp_path / "runs" / run_id / "model.pt").touch()
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    pd.DataFrame([dict(run_id=REMAINDER_REFERENCE, layer=0, estimator="remainder", rem_epochs=30,
                       within_2_points=True, pass_points=1, pass_seconds=17 * 6.0, analysis_device="NVIDIA H200",
                       rem_batch_size=512, rem_lr=0.4, rem_warmup_epochs=2, rem_momentum=0.9, rem_weight_decay=5e-4,
                       rem_precision="bf16", rem_seed=0, ixy_paper=0.88, network_accuracy=0.89)]).to_csv(
        analysis / "remainder_ceiling.csv", index=False)
    stage = {s.name: s for s in stages(tmp_path, ".data", "nvidia-h200")}["remainder:e2e-K1"]
    # 0.2 s an epoch and unit: point 1 (16 units) needs 1.25 * 16 * 0.2 * 30 / 60 = 2 min and the start.
    assert stage.minutes_needed() == pytest.approx(2.0 + REMAINDER_START_MINUTES)
    layers = stage.command(5.0 + REMAINDER_START_MINUTES)  # points 1 and 2 need 3.875 min, 1 to 3 need 5.625
    assert layers[layers.index("--layers") + 1] == "1,2"
    pd.DataFrame([dict(run_id=run_id, layer=layer, estimator="remainder") for layer in (1, 2)]).to_csv(
        analysis / "mutual_information.csv", index=False)
    assert not stage.done() and stage.progress() == ["2 of 16 layer points estimated"]
    assert stage.minutes_needed() == pytest.approx(1.25 * 14 * 0.2 * 30 / 60 + REMAINDER_START_MINUTES)
    layers = stage.command(100.0)
    assert layers[layers.index("--layers") + 1] == ",".join(map(str, range(3, 17)))


def test_plan_counts_only_gpu_results_and_gives_the_grid_its_measured_jobs_and_time(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    plan = {stage.name: stage for stage in stages(tmp_path, ".data")}
    assert list(plan) == ["epoch-bench", "table3", "module-parallel", "max-batch", "profile", "profile-resnet32",
                          "retime", "remainder-ceiling", "grid-jobs", "dgl-seed0", "table2", "dgl",
                          "bf16-twins", "table3-compiled"]  # no run has weights here
    assert not any(stage.done() for stage in plan.values())
    for name in ("resnet110-b1024-fp32-cpu.csv", "pipeline-resnet32-b1024-fp32-cpu.csv"):
        (bench / name).touch()
    assert not plan["table3"].done()  # CPU measurements do not count
    for name in ("resnet110-b1024-fp32-nvidia-h100.csv", "pipeline-resnet32-b1024-fp32-nvidia-h100.csv"):
        (bench / name).touch()
    assert plan["table3"].done() and not plan["table3-compiled"].done()
    (bench / "compiled").mkdir()
    (bench / "compiled" / "resnet110-b1024-fp32-nvidia-h100.csv").touch()
    assert plan["table3-compiled"].done()
    compiled = plan["table3-compiled"].command(9.0)
    assert compiled[compiled.index("--step") + 1] == "compiled"
    assert compiled[compiled.index("--out") + 1] == str(bench.resolve())
    (bench / "profile-resnet110-b1024-fp32-cpu.csv").touch()
    assert not plan["profile"].done()
    (bench / "profile-resnet110-b1024-fp32-nvidia-h100.csv").touch()
    assert not plan["profile"].done()  # a profile made before the idle-time analysis: made again
    (bench / "idle-resnet110-b1024-fp32-nvidia-h100.csv").touch()
    assert plan["profile"].done() and not plan["profile-resnet32"].done()
    (bench / "idle-resnet32-b1024-fp32-nvidia-h100.csv").touch()
    assert plan["profile-resnet32"].done()
    assert best_jobs(bench, "table2-resnet32", None) == 1
    retime = plan["retime"].command(9.0)
    assert retime[retime.index("--out") + 1] == str(bench.resolve() / "remeasured")
    jobs = bench / "grid-jobs-table2-resnet32-nvidia-h100.csv"
    pd.DataFrame({"jobs": [1, 2, 4], "best": [False, True, False]}).to_csv(jobs, index=False)
    assert not plan["grid-jobs"].done() and best_jobs(bench, "table2-resnet32", None) == 1  # summed runs that did not all overlap
    pd.DataFrame({"jobs": [1, 2, 4], "best": [False, True, False], "window_seconds": [9.0, 8.0, 7.0]}).to_csv(
        jobs, index=False)
    assert plan["grid-jobs"].done()
    command = plan["table2"].command(12.5)
    assert command[command.index("--jobs") + 1] == "2" and command[command.index("--time-budget") + 1] == "12.5"
    assert command[command.index("--dataset") + 1] == "cifar10-jpeg"
    dgl = plan["dgl"].command(3.0)
    assert dgl[dgl.index("experiments.grid") + 1] == "table2-dgl-resnet32" and dgl[dgl.index("--jobs") + 1] == "2"


def test_a_grid_stage_whose_run_is_nearly_done_starts_with_less_than_its_usual_two_minutes(tmp_path):
    """A lease's job with 2.0 min left skipped DGL K = 8's last 9 epochs (about 20 s) for want of 2 min."""
    from experiments.stages import GRID_MINUTES
    from infopro.grid import START_SECONDS

    plan = {stage.name: stage for stage in stages(tmp_path, ".data")}
    assert plan["dgl-seed0"].minutes_needed() == GRID_MINUTES  # nothing timed
    run = tmp_path / "runs" / "cifar10-jpeg-resnet32-dgl-K8-s0"
    run.mkdir(parents=True)
    pd.DataFrame({"epoch": range(1, 152), "epoch_seconds": 2.4}).to_csv(run / "metrics.csv", index=False)
    assert plan["dgl-seed0"].minutes_needed() == pytest.approx(START_SECONDS / 60 + 9 * 2.4 / 60)
    pd.DataFrame({"epoch": range(1, 101), "epoch_seconds": 2.4}).to_csv(run / "metrics.csv", index=False)
    assert plan["dgl-seed0"].minutes_needed() == GRID_MINUTES  # 60 epochs left: the usual floor


def test_the_grids_train_in_the_fastest_step_mode_the_gpus_epoch_benchmark_measured(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    plan = {stage.name: stage for stage in stages(tmp_path, None, "nvidia-h100")}

    def step_of(stage):
        command = plan[stage].command(10.0)
        return command[command.index("--step") + 1]

    assert step_of("table2") == step_of("grid-jobs") == "eager" and not plan["epoch-bench"].done()  # unmeasured
    rows = [{"method": method, "K": K, "mode": mode, "precision": "fp32",
             "epoch_seconds": {"eager": 1.0, "compiled": 1.5}[mode] * K}
            for method, K in (("e2e", 1), ("greedy", 4), ("infopro-contrast", 4), ("infopro-contrast", 16))
            for mode in ("eager", "compiled")]
    pd.DataFrame(rows[:-1]).to_csv(bench / "epoch-resnet32-nvidia-h100.csv", index=False)
    assert not plan["epoch-bench"].done() and step_of("table2") == "eager"  # one row left to measure
    pd.DataFrame(rows).to_csv(bench / "epoch-resnet32-nvidia-h100.csv", index=False)
    assert plan["epoch-bench"].done() and step_of("table2") == step_of("dgl") == "eager"
    for row in rows:
        row["epoch_seconds"] *= 0.5 if row["mode"] == "compiled" else 1
    pd.DataFrame(rows).to_csv(bench / "epoch-resnet32-nvidia-h100.csv", index=False)
    assert step_of("table2") == step_of("grid-jobs") == "compiled"
    # A mode that failed on one configuration keeps its row, with no time: never trained in, and no refusal.
    rows[-1] |= {"epoch_seconds": float("nan"), "error": "RuntimeError: inductor ran out of memory"}
    pd.DataFrame(rows).to_csv(bench / "epoch-resnet32-nvidia-h100.csv", index=False)
    assert plan["epoch-bench"].done() and step_of("table2") == "eager"


def test_retime_is_done_once_the_gpus_step_table_has_a_twin_timing_every_method(tmp_path):
    """The twin must carry the step table's own name (the same GPU) and every default method, and the
    pipeline must be timed again: a call cut short, or one made on another GPU, leaves the stage to do."""
    bench, remeasured = tmp_path / "bench", tmp_path / "bench" / "remeasured"
    remeasured.mkdir(parents=True)
    retime = {stage.name: stage for stage in stages(tmp_path, None)}["retime"]
    name = "resnet110-b1024-fp32-nvidia-h100.csv"
    (bench / name).touch()
    every = default_methods("resnet110")
    pd.DataFrame({"method": every}).to_csv(remeasured / "resnet110-b1024-fp32-nvidia-h200.csv", index=False)
    assert not retime.done()
    pd.DataFrame({"method": every[:-1]}).to_csv(remeasured / name, index=False)
    assert not retime.done()
    pd.DataFrame({"method": every}).to_csv(remeasured / name, index=False)
    assert not retime.done()
    (remeasured / "pipeline-resnet32-b1024-fp32-cpu.csv").touch()
    assert not retime.done()
    (remeasured / "pipeline-resnet32-b1024-fp32-nvidia-h100.csv").touch()
    assert retime.done()


def test_profiles_and_retime_on_a_gpu_add_to_that_gpus_own_measurements_or_do_nothing(tmp_path):
    """Table 3 sets the profile, the idle time and the re-measured times beside the step table of the
    same name, and ResNet-32's profile explains the pipeline comparison's epoch of the same GPU: only
    that GPU's files count; a GPU that measured neither has nothing to add to, and its lease goes to
    the grid."""
    bench, remeasured = tmp_path / "bench", tmp_path / "bench" / "remeasured"
    remeasured.mkdir(parents=True)
    for name in ("resnet110-b1024-fp32-nvidia-h100.csv", "pipeline-resnet32-b1024-fp32-nvidia-h100.csv",
                 "profile-resnet110-b1024-fp32-nvidia-h100.csv", "profile-resnet110-b1024-fp32-nvidia-h200.csv",
                 "idle-resnet110-b1024-fp32-nvidia-h200.csv", "idle-resnet32-b1024-fp32-nvidia-h200.csv"):
        (bench / name).touch()
    for gpu in ("nvidia-h100", "nvidia-h200"):
        pd.DataFrame({"method": default_methods("resnet110")}).to_csv(
            remeasured / f"resnet110-b1024-fp32-{gpu}.csv", index=False)
    (remeasured / "pipeline-resnet32-b1024-fp32-nvidia-h200.csv").touch()

    def stage(name, gpu):
        return {stage.name: stage for stage in stages(tmp_path, None, gpu)}[name]

    stages_adding = ("retime", "profile", "profile-resnet32")
    assert all(stage(name, "nvidia-h200").done() for name in stages_adding)  # nothing to add to
    for name in stages_adding:  # planning: the H200's files stand beside nothing it measured
        assert not stage(name, None).done() and not stage(name, "nvidia-h100").done()
    (remeasured / "pipeline-resnet32-b1024-fp32-nvidia-h100.csv").touch()
    (bench / "idle-resnet110-b1024-fp32-nvidia-h100.csv").touch()
    (bench / "idle-resnet32-b1024-fp32-nvidia-h100.csv").touch()
    assert all(stage(name, gpu).done() for name in stages_adding for gpu in ("nvidia-h100", None))


def test_cli_lists_the_plan_and_refuses_to_run_without_budget_or_gpu(tmp_path):
    result = run_main("experiments.reproduce", "--plan", "--results", str(tmp_path))
    lines = result.stdout.splitlines()
    stage_lines = [line for line in lines if not line.startswith(" ")]
    assert result.returncode == 0 and len(stage_lines) == 14 and len(lines) == 26
    assert all(line.startswith("to do") for line in stage_lines)
    assert [line.split()[2] for line in stage_lines[-4:]] == ["table2", "dgl", "bf16-twins", "table3-compiled"]
    for stage, runs in ((-13, 39), (-9, 12), (-5, 2)):  # each grid stage ends with `grid --status`'s three totals
        counts, left, gpu = lines[stage + 1:][:3]
        assert (counts.strip(), left.strip()) == (f"0 done, 0 partial, {runs} missing",
                                                  f"{runs} runs not timed (no seed of theirs has run an epoch)")
        assert gpu.strip().startswith(f"{runs} runs without a GPU share on record")
    for args, message in (([], "--time-budget"), (["--time-budget", "5"], "no CUDA device")):
        result = run_main("experiments.reproduce", *args, "--results", str(tmp_path))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def stand_in_gpu(monkeypatch, reproduce) -> None:
    """Let `experiments.reproduce` run its stages here: the CPU stands in for the GPU, a commit for git."""
    monkeypatch.setattr(reproduce, "resolve_device", lambda *args, **kwargs: torch.device("cpu"))
    monkeypatch.setattr(reproduce, "git_state", lambda: {"git_commit": "0123456789abcdef", "git_dirty": False})


def test_a_call_packs_what_it_made_then_says_what_is_left(tmp_path, monkeypatch, capsys):
    """The totals come last: a lease's results must be packed even when they cannot be read back."""
    import experiments.reproduce as reproduce
    results, parts = tmp_path / "results", tmp_path / "out"
    (results / "runs").mkdir(parents=True)
    made = python_stage("table2", f"open({str(results / 'runs' / 'r.csv')!r}, 'w').write('1')")
    stand_in_gpu(monkeypatch, reproduce)
    call = ["--time-budget", "1", "--results", str(results), "--pack-to", str(parts)]

    monkeypatch.setattr(reproduce, "stages", lambda *args: [replace(made, progress=lambda: ["1 done"])])
    cache = tmp_path / "inductor"
    (cache / "fxgraph").mkdir(parents=True)
    (cache / "fxgraph" / "graph").write_bytes(b"x" * 2**20)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    reproduce.main(call)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4:-2] == [f"packed 1 part into {parts}", "[table2] 1 done"]
    assert lines[-2].startswith("training epochs ran for 0.0 and remainder passes for 0.0 of this call's 0.0 min")
    assert lines[-1] == f"inductor's cache: 1.0 MiB in 1 files ({cache})"

    def unreadable():
        raise InfoProError("unreadable")

    shutil.rmtree(parts)
    monkeypatch.setattr(reproduce, "stages", lambda *args: [replace(made, progress=unreadable)])
    with pytest.raises(InfoProError, match="unreadable"):
        reproduce.main(call)
    assert [path.name for path in parts.iterdir()] == ["results-1.tar"]

    (tmp_path / "a-file").write_text("")  # where --pack-to must be a folder: refused before any stage
    capsys.readouterr()
    monkeypatch.setattr(reproduce, "stages", lambda *args: [python_stage("table2", "raise SystemExit('must not run')")])
    with pytest.raises(InfoProError, match="cannot write results in .*a-file"):
        reproduce.main([*call[:-1], str(tmp_path / "a-file" / "out")])
    assert "table2" not in capsys.readouterr().out


def test_the_training_share_counts_epochs_of_this_call_once_however_many_ran_side_by_side(tmp_path):
    """Epochs as metrics.csv records them: (ended_at, epoch_seconds), evaluation between them excluded."""
    import experiments.reproduce as reproduce
    began = 1000.0
    for run, epochs in {"a": [(1010, 10), (1025, 10)], "b": [(1015, 10), (1020, 5)],  # a and b overlap
                        "old": [(990, 10)], "resumed": [(None, 10), (1060, 20)]}.items():
        (tmp_path / run).mkdir()
        pd.DataFrame(epochs, columns=["ended_at", "epoch_seconds"]).to_csv(tmp_path / run / "metrics.csv", index=False)
    (tmp_path / "before-ended_at").mkdir()
    pd.DataFrame({"epoch_seconds": [5.0]}).to_csv(tmp_path / "before-ended_at" / "metrics.csv", index=False)
    # a: 1000-1010 (of which 1000 on: the epoch of "old" ended before the call), 1015-1025; b: 1005-1015,
    # 1015-1020; resumed: 1040-1060. Union from 1000: 1000-1025 and 1040-1060, 45 of 100 s.
    assert reproduce.training_share_line(tmp_path, began, began + 100) == \
        "training epochs ran for 0.8 and remainder passes for 0.0 of this call's 1.7 min (45%)"
    assert reproduce.training_share_line(tmp_path, began, began + 100, estimating=30) == \
        "training epochs ran for 0.8 and remainder passes for 0.5 of this call's 1.7 min (75%)"


def test_the_remainder_passes_of_a_call_are_told_apart_from_earlier_ones_by_run_and_seconds(tmp_path):
    """A pass's rows share its seconds; an earlier pass whose seconds come back a unit in the last place
    off (each pass rewrites the file) is not counted again."""
    import math
    from experiments.reproduce import remainder_passes, seconds_of_new_passes

    table = tmp_path / "mutual_information.csv"
    assert remainder_passes(table) == {}
    earlier = pd.DataFrame({"run_id": ["a", "a", "b"], "layer": [1, 2, 1],
                            "pass_seconds": [59.276504, 59.276504, None]})
    earlier.to_csv(table, index=False)
    before = remainder_passes(table)
    assert list(before.values()) == [59.276504]
    rewritten = earlier.assign(pass_seconds=[math.nextafter(59.276504, 60)] * 2 + [None])
    pd.concat([rewritten, pd.DataFrame({"run_id": ["c"] * 3, "layer": [1, 8, 16], "pass_seconds": 53.25})]).to_csv(
        table, index=False)
    assert seconds_of_new_passes(table, before) == 53.25


def test_each_stage_is_packed_before_the_next_starts(tmp_path, monkeypatch):
    """A call killed in a later stage (at the machine's time limit) must still bring back the earlier
    stages' results: the second stage finds the first one's file packed, and the second's joins it
    in a fresh packing, which leaves no part of the first behind."""
    import experiments.reproduce as reproduce
    results, parts = tmp_path / "results", tmp_path / "out"
    (results / "bench").mkdir(parents=True)
    first = results / "bench" / "first.csv"
    check = (f"import tarfile; names = tarfile.open({str(parts / 'results-1.tar')!r}).getnames(); "
             f"assert names == ['results/bench/first.csv'], names; "
             f"open({str(results / 'bench' / 'second.csv')!r}, 'w').write('2')")
    monkeypatch.setattr(reproduce, "stages", lambda *args: [
        python_stage("profile", f"open({str(first)!r}, 'w').write('x' * 3000)"), python_stage("retime", check)])
    stand_in_gpu(monkeypatch, reproduce)
    reproduce.main(["--time-budget", "1", "--results", str(results), "--pack-to", str(parts), "--pack-mib", "0.004"])
    assert sorted(path.name for path in parts.iterdir()) == ["results-1.tar", "results-2.tar"]  # a file a part
    packed = []
    for part in sorted(parts.iterdir()):
        with tarfile.open(part) as tar:
            packed.append(tar.getnames())
    assert packed == [["results/bench/first.csv"], ["results/bench/second.csv"]]
    first.write_text("")  # packed again smaller, into one part: the second part of before must go
    pack([first], tmp_path, parts, max_bytes=4096)
    assert [path.name for path in parts.iterdir()] == ["results-1.tar"]


def test_every_stage_command_is_accepted_by_its_entry_point_with_absolute_paths(tmp_path, monkeypatch):
    """A typo in a stage would cost a GPU lease: each command line must parse. Stages run in the
    repository root, so the caller's relative folders must reach them as absolute paths."""
    monkeypatch.chdir(tmp_path)
    for stage in stages(Path("results"), ".data"):
        command = stage.command(10.0)
        assert command[:2] == [sys.executable, "-m"]
        importlib.import_module(command[2]).parse_args(command[3:])
        paths = [command[i + 1] for i, part in enumerate(command) if part in ("--out", "--bench-out", "--data-root")]
        assert paths and all(path.startswith(str(tmp_path.resolve() / "results")) or
                             path == str(tmp_path.resolve() / ".data") for path in paths), command


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


def write(path, size: int, mtime: float):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    os.utime(path, (mtime, mtime))


def test_pack_returns_exactly_what_the_call_wrote_in_parts_under_the_limit(tmp_path):
    results, out = tmp_path / "repo" / "results", tmp_path / "out"
    began = time.time() - 100
    write(results / "runs" / "old" / "model.pt", 5000, began - 50)
    new = {results / "runs" / "a" / "checkpoint.pt": 36000, results / "runs" / "a" / "metrics.csv": 700,
           results / "runs" / "b" / "checkpoint.pt": 30000, results / "bench" / "x.csv": 10,
           results / "runs" / "huge" / "checkpoint.pt": 90000}
    for path, size in new.items():
        write(path, size, began + 1)
    write(results / "runs" / "a" / ".checkpoint.pt.k2j4x8.tmp", 100, began + 1)  # a write killed midway
    changed = results_since(results, began)
    assert set(changed) == set(new)
    parts = pack(changed, results.parent, out, max_bytes=64 * 1024)
    assert len(parts) == 3  # the two checkpoints cannot share a part; the huge one is alone
    restored = tmp_path / "restored"
    for part in parts:
        with tarfile.open(part) as tar:
            members = tar.getnames()
            tar.extractall(restored, filter="data")
        assert part.stat().st_size <= 64 * 1024 or members == ["results/runs/huge/checkpoint.pt"]
    for path in new:
        assert (restored / path.relative_to(results.parent)).read_bytes() == path.read_bytes()
    assert not (restored / "results" / "runs" / "old").exists()


def test_cli_refuses_a_part_size_that_is_not_positive(tmp_path):
    result = run_main("experiments.reproduce", "--time-budget", "5", "--pack-to", str(tmp_path), "--pack-mib", "0")
    assert result.returncode == 2 and "--pack-mib" in result.stderr and "Traceback" not in result.stderr


def test_the_remainder_stages_follow_the_value_order_and_count_done_by_their_rows(tmp_path):
    """The ceiling first; E2E and greedy SL of seed 0, and E2E's budget check, before DGL's seed 0, the
    unfinished runs of Table 2 before the other methods' estimates and InfoPro K = 2's budget check, the points
    between module ends after every network's key points, and all before the rest of the grid's seeds; a
    network's stage is done once each of its points has its remainder row, the ceiling once a candidate passed."""
    from experiments.stages import REMAINDER_REFERENCE

    runs = tmp_path / "runs"
    for network in ("e2e-K1", "greedy-K4", "infopro-contrast-K2"):
        (runs / f"cifar10-jpeg-resnet32-{network}-s0").mkdir(parents=True)
        (runs / f"cifar10-jpeg-resnet32-{network}-s0" / "model.pt").touch()
    partial = runs / "cifar10-jpeg-resnet32-greedy-K2-s1"
    partial.mkdir()
    (partial / "metrics.csv").write_text("epoch\n1\n")
    (partial / "checkpoint.pt").touch()
    plan = {stage.name: stage for stage in stages(tmp_path, ".data")}
    assert list(plan)[7:] == ["remainder-ceiling", "remainder-steps", "remainder:e2e-K1", "remainder:greedy-K4",
                              "remainder-budget:e2e-K1", "grid-jobs", "dgl-seed0", "table2-unfinished",
                              "remainder:infopro-contrast-K2", "remainder-budget:infopro-contrast-K2",
                              "remainder-between:greedy-K4",
                              "remainder-between:infopro-contrast-K2", "table2", "dgl", "bf16-twins",
                              "table3-compiled"]  # E2E's key points are all its points
    unfinished = plan["table2-unfinished"].command(5.0)
    assert unfinished[unfinished.index("--only") + 1:] == ["cifar10-jpeg-resnet32-greedy-K2-s1"]
    layers = plan["remainder:greedy-K4"].command(100.0)
    assert layers[layers.index("--only") + 1] == "cifar10-jpeg-resnet32-greedy-K4-s0"
    assert layers[layers.index("--layers") + 1] == "1,4,8,12,16"
    layers = plan["remainder-between:greedy-K4"].command(100.0)
    assert layers[layers.index("--layers") + 1] == "2,3,5,6,7,9,10,11,13,14,15"
    assert layers[layers.index("--step") + 1] == "eager"  # until graphed steps measured faster on this GPU
    # What a lease's call must carry for each (experiments.travel): the weights and checkpoints they start from.
    assert plan["remainder:greedy-K4"].reads() == [runs / "cifar10-jpeg-resnet32-greedy-K4-s0" / "model.pt"]
    assert plan["table2-unfinished"].reads() == plan["table2"].reads() == [partial / "checkpoint.pt"]
    assert plan["dgl-seed0"].reads() == plan["remainder-ceiling"].reads() == []
    weights = [runs / REMAINDER_REFERENCE / "model.pt"]
    assert plan["remainder-steps"].reads() == plan["remainder-budget:e2e-K1"].reads() == weights
    budget = plan["remainder-budget:infopro-contrast-K2"].command(100.0)
    assert budget[budget.index("--reference") + 1] == "cifar10-jpeg-resnet32-infopro-contrast-K2-s0"
    assert budget[budget.index("--layers") + 1] == "1,8,16" and budget[budget.index("--out") + 1].endswith(
        "remainder_budget.csv")
    analysis = tmp_path / "analysis"
    analysis.mkdir()
    rows = pd.DataFrame({"run_id": "cifar10-jpeg-resnet32-greedy-K4-s0", "layer": range(1, 17), "estimator": "1c2f"})
    rows.to_csv(analysis / "mutual_information.csv", index=False)
    assert not plan["remainder:greedy-K4"].done()
    key = rows["layer"].isin([1, 4, 8, 12, 16])
    rows[key].assign(estimator="remainder").to_csv(analysis / "mutual_information.csv", index=False)
    assert plan["remainder:greedy-K4"].done() and not plan["remainder-between:greedy-K4"].done()
    assert plan["remainder-between:greedy-K4"].progress() == []  # none of its own points yet
    rows.assign(estimator="remainder").to_csv(analysis / "mutual_information.csv", index=False)
    assert plan["remainder-between:greedy-K4"].done() and not plan["remainder:e2e-K1"].done()
    budget_rows = pd.DataFrame({"run_id": REMAINDER_REFERENCE, "layer": [1, 8], "estimator": "remainder"})
    budget_rows.to_csv(analysis / "remainder_budget.csv", index=False)
    assert not plan["remainder-budget:e2e-K1"].done()  # its rows, not the figure's, count: layer 16 is missing
    pd.concat([budget_rows, budget_rows.assign(layer=16)]).to_csv(analysis / "remainder_budget.csv", index=False)
    assert plan["remainder-budget:e2e-K1"].done() and not plan["remainder-budget:infopro-contrast-K2"].done()
    ceiling = pd.DataFrame({"run_id": [REMAINDER_REFERENCE], "rem_epochs": [30], "within_2_points": [False]})
    ceiling.to_csv(analysis / "remainder_ceiling.csv", index=False)
    assert not plan["remainder-ceiling"].done()
    ceiling.assign(within_2_points=True).to_csv(analysis / "remainder_ceiling.csv", index=False)
    assert plan["remainder-ceiling"].done()
