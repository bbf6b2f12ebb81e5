"""The benchmark: its exact memory measure, its method names, its search, every method's memory and
work, the CLI."""

import gc

import pandas as pd
import pytest
import torch

from conftest import run_cli, run_main
import infopro.bench_runner
import infopro.max_batch
from infopro.bench import count_work, idle_or_error, measure, with_ratios
from infopro.bench_methods import Method, default_methods
from infopro.bench_runner import run_profiles
from infopro.max_batch import cuda_peak_bytes, largest_fitting, search_max_batches
from infopro import models
from infopro.errors import InfoProError
from infopro.memory import PeakTensorMemory


def test_peak_tensor_memory_counts_allocations_not_views_or_existing_tensors():
    weight = torch.randn(1000)                  # exists before: never counted
    with PeakTensorMemory() as memory:
        a = weight * 2                          # 4000 bytes
        view = a[:10]                           # a view: nothing new
        b = a + 1                               # 4000 more: peak 8000
        a.mul_(3)                               # in place: nothing new
        transposed = weight.view(10, 100).t()   # view of an existing tensor
        del a
        gc.collect()
        assert memory.current_bytes == 8000     # `view` keeps a's storage alive
        del view
        gc.collect()
        assert memory.current_bytes == 4000
    assert memory.peak_bytes == 8000 and transposed.shape == (100, 10) and b.numel() == 1000


def test_method_names():
    assert [Method.parse(m).label for m in ("e2e", "infopro:4", "infopro-balanced:3")] == \
        ["e2e", "infopro:4", "infopro-balanced:3"]
    for bad, message in (("dni:4", "unknown method"), ("dgl", "give K"), ("e2e:2", "takes no K")):
        with pytest.raises(InfoProError, match=message):
            Method.parse(bad)
    assert "infopro-balanced:4" in default_methods("resnet110")
    assert not any("balanced" in m for m in default_methods("resnet32"))
    assert Method.parse("infopro-softmax:4").config("resnet32", 8, "fp32").task_loss == "softmax"
    assert Method.parse("infopro:4").config("resnet32", 8, "fp32").task_loss == "contrast"
    assert Method.parse("dgl:4").config("resnet32", 8, "fp32").regime == "dgl"


def test_largest_fitting_batch_is_found_within_two_percent_from_any_guess():
    for cap in (5, 31, 32, 100, 5000, 70000):
        for guess in (32, cap, 3 * cap):
            found = largest_fitting(lambda batch: batch <= cap, guess)
            assert found == min(cap, 1 << 16) or found <= cap and cap - found <= max(8, cap // 50), (cap, guess)
    trials = []
    assert largest_fitting(lambda batch: trials.append(batch) or batch <= 5000, guess=4990) >= 4900
    assert len(trials) <= 3  # a good guess settles at once


def test_max_batch_search_uses_real_trials_and_few_of_them():
    """A fake GPU: a fixed part, a per-image part and a workspace that grows faster than linearly,
    so the calibration line mispredicts; the answers must still be within 2% of the truth."""
    def true_bytes(batch):
        return 300e6 + 9e6 * batch + 2e3 * batch ** 2

    trials = []

    def peak_bytes(batch, cap):
        trials.append((batch, cap))
        return true_bytes(batch) if cap is None or true_bytes(batch) <= cap else None

    caps = [8 * 2**30, 2 * 2**30, 4 * 2**30]
    found = search_max_batches(peak_bytes, caps)
    for cap, batch in zip(caps, found):
        truth = max(b for b in range(1, 5000) if true_bytes(b) <= cap)
        assert batch <= truth and truth - batch <= max(8, truth // 50), (cap, batch, truth)
    assert trials[:2] == [(64, None), (128, None)] and len(trials) <= 2 + 5 * len(caps)


def test_cuda_cap_is_set_on_a_device_ordinal(monkeypatch):
    """The first H100 lease found every max-batch trial refused: torch's
    `set_per_process_memory_fraction` takes an ordinal, not the bare "cuda" device the CLI
    resolves to. A stand-in for torch.cuda that refuses as torch does checks the cap reaches it."""
    caps = []

    def set_fraction(fraction, device):
        if not isinstance(device, int):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        caps.append((fraction, device))

    cuda = {"current_device": lambda: 0, "set_per_process_memory_fraction": set_fraction,
            "get_device_properties": lambda index: type("Properties", (), {"total_memory": 80 * 2**30}),
            "reset_peak_memory_stats": lambda device: None, "synchronize": lambda device: None,
            "max_memory_allocated": lambda device: 123, "empty_cache": lambda: None}
    for name, stand_in in cuda.items():
        monkeypatch.setattr(torch.cuda, name, stand_in)
    step = (None, torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), None, lambda: None)
    monkeypatch.setattr(infopro.max_batch, "prepare_step", lambda *args: step)
    peak_bytes = cuda_peak_bytes(Method.parse("e2e"), "resnet32", "fp32", torch.device("cuda"))
    assert peak_bytes(64, 2 * 2**30) == 123 and peak_bytes(64, None) == 123
    assert caps == [(2 / 80, 0), (1.0, 0)]


def test_every_method_orders_memory_as_theory_says():
    """Exact, device-independent peaks of one step per method (in this process: no CUDA state to isolate)."""
    methods = ["e2e", "checkpoint", "greedy:16", "infopro:2", "infopro:16", "infopro+checkpoint:2",
               "infopro-balanced:2", "infopro-balanced:3", "infopro-balanced:4"]
    rows = [measure(Method.parse(m), "resnet110", 8, "fp32", torch.device("cpu"), steps=1, warmup=0)
            for m in methods]
    table = with_ratios(pd.DataFrame(rows)).set_index("method")
    step = table["peak_step_tensor_bytes_vs_e2e"]
    assert step["checkpoint"] < 0.6 and step["infopro:16"] < 0.5 and step["greedy:16"] < step["infopro:16"]
    assert step["infopro-balanced:4"] < step["infopro-balanced:3"] < step["infopro-balanced:2"] < 1
    assert step["infopro+checkpoint:2"] < step["infopro:2"]
    assert table.loc["infopro:16", "peak_saved_activation_bytes_vs_e2e"] <= 0.25


@pytest.mark.slow
def test_a_compiled_step_table_times_compiled_modules_and_keeps_the_eager_exact_measures(monkeypatch):
    """Compiling a ResNet-32 takes a minute on a CPU: a ResNet-8 of the same blocks stands in."""
    monkeypatch.setitem(models.ARCHS, "resnet8", 8)
    rows = {mode: measure(Method.parse("e2e"), "resnet8", 8, "fp32", torch.device("cpu"), steps=2, warmup=1,
                          step_mode=mode) for mode in ("eager", "compiled")}
    assert rows["compiled"]["step_mode"] == "compiled" and rows["eager"]["step_mode"] == "eager"
    for exact in ("peak_step_tensor_bytes", "peak_saved_activation_bytes"):
        assert rows["compiled"][exact] == rows["eager"][exact]


def test_checkpointing_and_offloading_are_not_timed_compiled():
    """torch.compile refuses checkpoint_sequential, and would step past offloading's saved-tensor hooks."""
    for method in ("checkpoint", "offload", "infopro+checkpoint:2"):
        with pytest.raises(InfoProError, match="steps eagerly only"):
            measure(Method.parse(method), "resnet32", 8, "fp32", torch.device("cpu"), steps=1, warmup=0,
                    step_mode="compiled")


def test_the_work_of_a_step_follows_what_each_method_computes():
    """Offloading moves tensors and computes nothing more (and off a GPU moves nothing, so its
    operators are not counted there); checkpointing recomputes part of the forward pass (a third
    of a step at most); a gradient-isolated module computes no gradient for its input; InfoPro's
    decoders work at the image's size; its two task terms differ only in the head's last layer and
    the contrastive term's batch-by-batch similarities, a handful of operators more."""
    methods = ["e2e", "offload", "checkpoint", "greedy:16", "infopro:16", "infopro-softmax:16"]
    work = count_work(methods, "resnet32", 16, "fp32", torch.device("cpu"), log=lambda line: None).set_index("method")
    flops, operators = work["step_flops_vs_e2e"], work["step_operators_vs_e2e"]
    assert flops["offload"] == 1 and 1.1 < flops["checkpoint"] < 4 / 3
    assert flops["greedy:16"] < 1 < flops["infopro-softmax:16"] < flops["infopro:16"]
    assert flops["infopro:16"] < 1.01 * flops["infopro-softmax:16"]
    assert pd.isna(operators["offload"]) and pd.isna(work.loc["offload", "step_bytes_accessed"])
    assert 1 < operators["checkpoint"] < 2 and 1 < work.loc["checkpoint", "step_bytes_accessed_vs_e2e"] < 2
    assert 1 < operators["infopro-softmax:16"] < operators["infopro:16"]
    assert work.loc["e2e", "step_operators"] > 3 * 31  # a convolution, a normalisation and a ReLU per layer at least


def test_work_is_counted_beside_e2e_even_when_e2e_is_not_asked_for(tmp_path):
    result = run_main("experiments.bench", "--device", "cpu", "--quick", "--arch", "resnet32", "--methods",
                      "greedy:2", "--measure", "work", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    work = pd.read_csv(tmp_path / "work-resnet32-b32.csv").set_index("method")
    assert list(work.index) == ["e2e", "greedy:2"] and work.loc["e2e", "step_operators_vs_e2e"] == 1


@pytest.mark.slow
def test_quick_cpu_benchmark_measures_each_method_in_a_fresh_process(tmp_path):
    result = run_cli("experiments.bench", "--device", "cpu", "--quick", "--arch", "resnet32", "--methods", "e2e",
                     "infopro:2", "offload", "--measure", "steps", "pipeline", "work", "profile",
                     "--pipeline-images", "128", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(tmp_path / "resnet32-b32-fp32-cpu.csv").set_index("method")
    assert list(table.index) == ["e2e", "infopro:2", "offload"]
    assert "error" not in table or table["error"].isna().all()
    assert (table["step_seconds"] > 0).all() and table.loc["e2e", "step_seconds_vs_e2e"] == 1
    assert table["git_commit"].notna().all() and (table["device"] == "cpu").all()
    assert table["cuda_mallocs_in_timed_steps"].isna().all()  # the CUDA allocator's counts: none on a CPU
    pipeline = pd.read_csv(tmp_path / "pipeline-resnet32-b32-fp32-cpu.csv")
    assert pipeline.loc[0, "ours_epoch_seconds"] > 0 and pipeline.loc[0, "reference_epoch_seconds"] > 0
    work = pd.read_csv(tmp_path / "work-resnet32-b32.csv").set_index("method")
    assert work.loc["offload", "step_flops"] == work.loc["e2e", "step_flops"] < work.loc["infopro:2", "step_flops"]
    assert work.loc["e2e", "step_operators"] < work.loc["infopro:2", "step_operators"]
    assert work["git_commit"].notna().all() and (work["batch_size"] == 32).all()
    profile = pd.read_csv(tmp_path / "profile-resnet32-b32-fp32-cpu.csv")
    assert set(profile["method"]) == {"e2e", "infopro:2", "offload"} and (profile["calls_per_step"] > 0).all()
    for _, operators in profile.groupby("method"):
        assert operators["share"].between(0, 1).all() and operators["share"].sum() <= 1 + 1e-9
        assert "convolution" in operators.sort_values("share").iloc[-1]["operator"]  # a CPU step's biggest cost
    assert not (tmp_path / "idle-resnet32-b32-fp32-cpu.csv").exists()  # the GPU's idle time: CUDA only


def test_the_pipeline_comparison_runs_at_the_precision_asked_for(tmp_path):
    """--precision was once ignored by --measure pipeline, which then wrote fp32 epochs for a bf16 call."""
    result = run_main("experiments.bench", "--device", "cpu", "--quick", "--arch", "resnet32", "--measure", "pipeline",
                      "--precision", "bf16", "--pipeline-images", "64", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    pipeline = pd.read_csv(tmp_path / "pipeline-resnet32-b32-bf16-cpu.csv")
    assert pipeline.loc[0, "precision"] == "bf16" and pipeline.loc[0, "ours_epoch_seconds"] > 0


def test_profiles_keep_each_methods_idle_record_and_log_its_longest_gap(monkeypatch):
    """A stand-in worker on CUDA: one method answers with an idle record, one without (no GPU
    activity), one fails, and one's idle analysis fails: all but the second get idle rows, under their
    own labels, so that a failure is recorded rather than profiled again at every lease."""
    idle = {"idle_ms_per_step": 2.0, "longest_gap_ms": 1.5, "longest_gap_cause": "allocator"}
    idle |= {f"idle_{cause}_ms_per_step": 0.0 for cause in infopro.bench_runner.CAUSES}
    operators = [{"operator": "conv", "calls_per_step": 1.0, "self_ms_per_step": 1.0, "share": 1.0}]
    failed = {"error": "idle analysis: KeyError: 0"}
    answers = {"e2e": {"operators": operators, "gpu_idle": idle}, "greedy:2": {"operators": operators, "gpu_idle": {}},
               "infopro:2": {"error": "out of memory"}, "infopro:4": {"operators": operators, "gpu_idle": failed}}
    monkeypatch.setattr(infopro.bench_runner, "run_in_fresh_process", lambda args, timeout: answers[args[0]])
    lines = []
    rows, idle_rows = run_profiles(list(answers), "resnet32", 8, "fp32", "cuda", 1, 0, log=lines.append)
    assert [row["method"] for row in rows] == ["e2e", "greedy:2", "infopro:2", "infopro:4"]
    assert rows[2]["error"] == "out of memory"
    assert idle_rows == [{"method": "e2e"} | idle, {"method": "infopro:2", "error": "out of memory"},
                         {"method": "infopro:4"} | failed]
    assert "longest gap 1.5 ms (allocator)" in lines[1] and lines[-1].endswith("error: idle analysis: KeyError: 0")


def test_a_failing_idle_analysis_is_recorded_not_raised():
    """The operators of a profile stand without it; its row says what stopped it."""
    assert idle_or_error([object()], steps=1)["error"].startswith("idle analysis: AttributeError")
    assert idle_or_error([], steps=1) == {}  # a CPU's profile: no GPU activity, no record


def test_bench_refuses_bad_input_in_one_line(tmp_path):
    for args, message in ((["--methods", "infopro"], "give K"),
                          (["--measure", "max-batch", "--methods", "e2e", "--device", "cpu"], "needs --device cuda"),
                          (["--measure", "max-batch", "--methods", "e2m", "--device", "cpu"], "unknown method"),
                          (["--caps", "2,four"], "argument --caps: 'four' is not a number"),
                          (["--caps", "0"], "argument --caps: 0 is not a finite number above 0"),
                          (["--caps", "2,inf"], "argument --caps: inf is not a finite number above 0"),
                          (["--methods", "e2e", "greedy:1"],  # measured E2E again as "greedy:1"
                           "method 'greedy:1': the paper gives resnet110 no paper split at K=1; valid K: 2, 3"),
                          (["--arch", "resnet32", "--methods", "e2e", "infopro:3"],  # failed in its worker, exit 0
                           "no paper split with λ1, λ2 at K=3; valid K: 2, 4, 8, 16"),
                          (["--arch", "resnet32", "--methods", "infopro-balanced:2"],
                           "the paper gives resnet32 no balanced split with λ1, λ2 at K=2; valid K: none"),
                          (["--measure", "speed"], "invalid choice"),
                          (["--step", "compiled", "--measure", "steps", "profile"],
                           "--step compiled times steps only")):
        result = run_main("experiments.bench", *args, "--out", str(tmp_path))
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    (tmp_path / "a-file").write_text("")  # where --out must be a folder: refused before any measuring
    result = run_main("experiments.bench", "--device", "cpu", "--quick", "--arch", "resnet32", "--methods", "e2e",
                      "--out", str(tmp_path / "a-file" / "bench"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "cannot write results in" in result.stderr and "e2e" not in result.stdout
