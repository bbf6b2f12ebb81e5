"""Paces to plan GPU time with: each epoch's share of a GPU that runs shared, and a grid's GPU time left."""

import json
from dataclasses import asdict, replace

import pandas as pd
import pytest

from infopro.config import TrainConfig
from infopro.grid import get_grid
from infopro.grid_status import RunStatus, gpu_time_line, grid_status, status_summary
from infopro.paces import AlonePace, ShareRatio, alone_paces, benchmark_paces, share_ratio, shared_seconds


def test_an_interval_alone_keeps_its_length_and_overlaps_split_each_moment_evenly():
    assert shared_seconds([(0, 10)]) == [10]
    assert shared_seconds([(0, 10), (5, 15)]) == [7.5, 7.5]  # 5 s alone and half of the 5 s together, each
    assert shared_seconds([(0, 4), (4, 8)]) == [4, 4]  # one after the other: nothing shared
    # Three at once from 2 to 4 s: a third each; the first alone for 8 s. The shares add up to the time covered.
    shares = shared_seconds([(0, 10), (2, 4), (2, 4)])
    assert shares == pytest.approx([8 + 2 / 3, 2 / 3, 2 / 3]) and sum(shares) == pytest.approx(10)
    # An epoch timed at 0 s (its start is its end) shares no moment, and does not stay running after it.
    assert shared_seconds([(0, 0), (0, 4), (4, 8)]) == [0, 4, 4]


def write_run(root, run_id, gpu, intervals, ended_at=True, config=None):
    """A run directory whose epochs trained over the given (start, end) Unix seconds, last on `gpu` (None: a CPU);
    `config`: the TrainConfig its config.json records."""
    run = root / run_id
    run.mkdir(parents=True)
    device = {"device": "cuda", "device_name": gpu} if gpu else {"device": "cpu", "device_name": "some CPU"}
    record = {"run_id": run_id, "provenance": device} | ({"config": asdict(config)} if config else {})
    (run / "config.json").write_text(json.dumps(record))
    metrics = pd.DataFrame({"epoch": range(1, len(intervals) + 1),
                            "epoch_seconds": [end - start for start, end in intervals]})
    if ended_at:
        metrics["ended_at"] = [end for _, end in intervals]
    metrics.to_csv(run / "metrics.csv", index=False)


def test_runs_sharing_a_gpu_each_need_their_share_of_it_and_runs_elsewhere_are_apart(tmp_path):
    """Two runs took 4 s an epoch side by side on an H100: 2 s of it each. A run on an H200 at the same
    moments shared nothing with them (another machine); a CPU run and one from before `ended_at` give no share."""
    both = [(t, t + 4.0) for t in range(0, 40, 4)]
    write_run(tmp_path, "a-s0", "H100", both)
    write_run(tmp_path, "b-s0", "H100", both)
    write_run(tmp_path, "c-s0", "H200", both)
    write_run(tmp_path, "d-s0", None, both)
    write_run(tmp_path, "e-s0", "H100", both, ended_at=False)
    assert alone_paces(tmp_path) == {"a-s0": AlonePace(2.0, "H100"), "b-s0": AlonePace(2.0, "H100"),
                                     "c-s0": AlonePace(4.0, "H200")}


def test_a_runs_gpu_share_is_its_last_ten_epochs_median(tmp_path):
    """Four runs at once, then the last epoch alone: the share is a quarter of the shared epochs (the
    median of the last ten), not the alone epoch's whole length."""
    shared = [(t, t + 8.0) for t in range(0, 96, 8)]
    for name in ("a", "b", "c"):
        write_run(tmp_path, f"{name}-s0", "H100", shared)
    write_run(tmp_path, "d-s0", "H100", shared + [(96.0, 98.0)])
    assert alone_paces(tmp_path)["d-s0"] == AlonePace(2.0, "H100")


def test_the_gpu_time_left_comes_from_each_runs_share_or_another_seeds(tmp_path):
    """Seed 0 of E2E trained 10 of its 160 epochs at 3 s an epoch alone; seed 1 has not started: 150 and
    160 epochs at seed 0's share. Greedy SL K = 2 has no share on record (trained before `ended_at`)."""
    configs = [replace(config, epochs=160) for config in get_grid("table2-resnet32").configs(
        seeds=(0, 1), only=["e2e", "greedy-K2-"], dataset="cifar10-jpeg")]
    e2e0, greedy0 = (config.run_id() for config in configs[:2])
    write_run(tmp_path, e2e0, "H200", [(3.0 * i, 3.0 * i + 3) for i in range(10)])
    write_run(tmp_path, greedy0, "H200", [(100.0, 104.0)], ended_at=False)
    statuses = grid_status(configs, tmp_path)
    assert [status.gpu_minutes for status in statuses] == [150 * 3 / 60, None, 160 * 3 / 60, None]
    assert statuses[0].gpu == "H200"
    assert status_summary(statuses, lease_minutes=15)[-1] == (
        "about 16 min of GPU time (H200) in 2 runs, each at the share of the GPU its configuration's recent "
        "epochs took; at least 2 leases of 15 device-minutes; 2 runs without a GPU share on record (no epoch of their "
        "configuration on a GPU recorded when it ran, no epoch benchmark of it and no pace of it on a GPU to "
        "scale)")


def test_the_gpu_time_line_counts_leases_only_when_asked_and_only_of_the_runs_it_can_time():
    timed, untimed = RunStatus("missing", gpu_minutes=20.0, gpu="H200"), RunStatus("missing")
    assert gpu_time_line([timed]) == ("about 20 min of GPU time (H200) in 1 run, each at the share of the GPU "
                                      "its configuration's recent epochs took")
    assert gpu_time_line([timed], lease_minutes=10).endswith("; at least 2 leases of 10 device-minutes")
    assert gpu_time_line([untimed], lease_minutes=10) == ("1 run without a GPU share on record (no epoch of their "
                                                          "configuration on a GPU recorded when it ran, no epoch "
                                                          "benchmark of it and no pace of it on a GPU to scale)")


def write_epoch_bench(bench, gpu_slug, rows):
    """An epoch benchmark's table (`infopro.epoch_bench`) of the grid's recipe on `gpu_slug`."""
    bench.mkdir(exist_ok=True)
    recipe = dict(arch="resnet32", dataset="cifar10-jpeg", batch_size=1024, precision="fp32", jobs=1,
                  device="cpu" if gpu_slug == "cpu" else "cuda", device_name=gpu_slug.upper())
    pd.DataFrame([recipe | row for row in rows]).to_csv(bench / f"epoch-resnet32-{gpu_slug}.csv", index=False)


def test_a_run_without_a_share_takes_its_gpus_epoch_benchmark_of_its_configuration(tmp_path):
    """Greedy SL K = 2 was benchmarked alone on an H200 at 2 s an epoch eagerly, the mode training takes there
    (compiling would cost 600 s a process); InfoPro (Contrast) K = 4 only in a smoke run (batch 64) and on a
    CPU. A run's own share, once it has one, comes first."""
    configs = get_grid("table2-resnet32").configs(seeds=(0,), only=["greedy-K2-", "contrast-K4"],
                                                  dataset="cifar10-jpeg")
    runs, bench = tmp_path / "runs", tmp_path / "bench"
    runs.mkdir()
    greedy = dict(method="greedy", K=2)
    contrast = dict(method="infopro-contrast", K=4, mode="eager", epoch_seconds=1.0, compile_seconds=1.0)
    write_epoch_bench(bench, "nvidia-h200", [greedy | dict(mode="eager", epoch_seconds=2.0, compile_seconds=1.0),
                                             greedy | dict(mode="compiled", epoch_seconds=1.5, compile_seconds=600.0),
                                             contrast | dict(batch_size=64)])
    write_epoch_bench(bench, "cpu", [contrast])
    statuses = grid_status(configs, runs, bench)
    assert [(status.gpu_minutes, status.gpu_benchmark) for status in statuses] == [(160 * 2.0 / 60, True),
                                                                                   (None, False)]
    assert statuses[0].gpu == "NVIDIA-H200"
    assert "(1 of them at the GPU's epoch benchmark of the configuration, alone)" in gpu_time_line(statuses)
    write_run(runs, configs[0].run_id(), "NVIDIA-H200", [(3.0 * i, 3.0 * i + 3) for i in range(10)])
    status = grid_status(configs, runs, bench)[0]
    assert (status.gpu_minutes, status.gpu_benchmark) == (150 * 3.0 / 60, False)


def test_a_pace_beside_other_runs_is_scaled_by_what_the_benchmark_took_of_such_paces(tmp_path):
    """E2E and greedy SL K = 4 trained at 5 s an epoch on an H100 beside an unrecorded number of other runs (before
    `ended_at`); the H200's epoch benchmark timed them alone at 1 and 1.5 s: ratios 0.2 and 0.3. InfoPro (Contrast)
    K = 2, never benchmarked, trained at 6 s an epoch so: its seed 1 needs 160 epochs of 6 s times 0.25 of the H200.
    A run with a share of its own and one on a CPU add no ratio; a pace measured on a CPU is not scaled."""
    def config(regime, K, seed=0, **more):
        return TrainConfig(regime=regime, K=K, dataset="cifar10-jpeg", seed=seed, **more)

    runs, bench = tmp_path / "runs", tmp_path / "bench"

    def trained(run_config, gpu, seconds, ended_at=False):  # ten epochs of `seconds` each
        write_run(runs, run_config.run_id(), gpu, [(seconds * i, seconds * i + seconds) for i in range(10)],
                  ended_at, run_config)

    trained(config("e2e", 1), "H100", 5.0)
    trained(config("greedy", 4), "H100", 5.0)
    trained(config("e2e", 1, 1), "H100", 3.0, ended_at=True)  # a share of its own
    trained(config("greedy", 4, 1), None, 600.0)
    contrast, softmax = config("infopro", 2, task_loss="contrast"), config("infopro", 2, task_loss="softmax")
    trained(contrast, "H100", 6.0)
    trained(softmax, None, 600.0)
    timed = dict(mode="eager", compile_seconds=1.0)
    write_epoch_bench(bench, "nvidia-h200", [dict(method="e2e", K=1, epoch_seconds=1.0) | timed,
                                             dict(method="greedy", K=4, epoch_seconds=1.5) | timed])
    ratio = share_ratio(runs, benchmark_paces(bench), alone_paces(runs))
    assert ratio == ShareRatio((0.2, 0.3), "NVIDIA-H200") and ratio.median == 0.25
    assert share_ratio(runs, {}, alone_paces(runs)) is None
    statuses = grid_status([replace(contrast, seed=1), replace(softmax, seed=1)], runs, bench)
    assert (statuses[0].gpu_minutes, statuses[0].gpu, statuses[0].gpu_scaled) == pytest.approx(
        (160 * 6.0 * 0.25 / 60, "NVIDIA-H200", ratio))
    assert statuses[1].gpu_minutes is None  # its seed 0's pace is a CPU's
    assert gpu_time_line(statuses) == (
        "about 4 min of GPU time (NVIDIA-H200) in 1 run, each at the share of the GPU its configuration's recent "
        "epochs took (1 at their pace beside other runs times 0.25, the median ratio of the benchmark to such a pace "
        "over 2 runs (0.20 to 0.30)); 1 run without a GPU share on record (no epoch of their configuration on a GPU "
        "recorded when it ran, no epoch benchmark of it and no pace of it on a GPU to scale)")
