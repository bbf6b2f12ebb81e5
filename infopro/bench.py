"""Memory and speed of one training step, under one protocol, for every family of memory saving.

Methods (each measured in a fresh process, so no allocator state leaks between them):

* ``e2e``                    end-to-end training;
* ``checkpoint``             E2E with gradient checkpointing over ceil(sqrt(n)) segments of the
                             n layers (Chen et al., 2016; `torch.utils.checkpoint`, non-reentrant);
* ``offload``                E2E with every saved activation kept in (pinned) host memory
                             (`torch.autograd.graph.save_on_cpu`; vDNN-style);
* ``greedy:K``, ``infopro:K`` local learning with the paper's equal-depth splits;
* ``infopro-balanced:K``     InfoPro* (ResNet-110, K = 2, 3, 4: memory-balanced splits);
* ``infopro+checkpoint:K``   InfoPro with checkpointing inside each local module.

Measures per method, after warm-up steps (which include cuDNN's autotuning):
median step time (CUDA events, no per-step synchronisation; wall clock on CPU) and images/s;
`max_memory_allocated` / `max_memory_reserved` after `reset_peak_memory_stats()`; the
device's used memory from cudaMemGetInfo (includes the CUDA context and everything else on
the GPU: never model memory); and two device-independent, exact measures of one step:
the peak bytes of tensors allocated during forward+backward (`PeakTensorMemory`) and the
peak saved-activation bytes (`SavedActivations`; not defined for checkpoint/offload, which
manage saved tensors themselves). Parameters, gradients-to-be and optimizer state are
reported separately; the benchmark holds one batch, not a dataset, on the device.
"""

import json
import math
import re
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.utils.checkpoint import checkpoint_sequential

from infopro.data import augmented_batch
from infopro.errors import InfoProError
from infopro.local import run_layers
from infopro.memory import PeakTensorMemory, SavedActivations
from infopro.records import REPO_ROOT, device_name, write_csv
from infopro.splits import PAPER_SPLITS
from infopro.train import TrainConfig, build_net, configure_backends, place, train_step

FAMILIES = ("e2e", "checkpoint", "offload", "greedy", "infopro", "infopro-balanced", "infopro+checkpoint")
LOCAL_KS = (2, 4, 8, 16)


@dataclass(frozen=True)
class Method:
    """A way of training one step: a family and, for local learning, K."""

    family: str
    K: int = 1

    @classmethod
    def parse(cls, text: str) -> "Method":
        family, _, k = text.partition(":")
        if family not in FAMILIES:
            raise InfoProError(f"unknown method {text!r}; valid: e2e, checkpoint, offload, greedy:K, infopro:K, "
                               f"infopro-balanced:K, infopro+checkpoint:K")
        local = family not in ("e2e", "checkpoint", "offload")
        if local != bool(k) or (k and not k.isdigit()):
            raise InfoProError(f"method {text!r}: {'give K as ' + family + ':K' if local else family + ' takes no K'}")
        return cls(family, int(k) if k else 1)

    @property
    def label(self) -> str:
        return f"{self.family}:{self.K}" if self.K > 1 or self.family not in ("e2e", "checkpoint", "offload") \
            else self.family

    def config(self, arch: str, batch_size: int, precision: str) -> TrainConfig:
        regime = {"greedy": "greedy", "e2e": "e2e", "checkpoint": "e2e", "offload": "e2e"}.get(self.family, "infopro")
        split = "balanced" if self.family == "infopro-balanced" else "paper"
        return TrainConfig(arch=arch, regime=regime, K=self.K, split=split, dataset="synthetic",
                           batch_size=batch_size, precision=precision)

    def run_segment(self):
        return checkpointed if "checkpoint" in self.family else run_layers

    def context(self, device: torch.device):
        """Saved-tensor offloading for `offload` (pinned host memory on CUDA)."""
        if self.family == "offload":
            return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
        return nullcontext()

    @property
    def manages_saved_tensors(self) -> bool:
        return self.family in ("checkpoint", "offload", "infopro+checkpoint")


def checkpointed(layers, h: torch.Tensor) -> torch.Tensor:
    """Run `layers` as ceil(sqrt(n)) checkpointed segments (the last is kept, as usual).

    Recomputation runs BN in train mode a second time, which updates its running
    statistics twice per step: harmless for timing and memory, noted for anyone training
    with it.
    """
    layers = list(layers)
    if len(layers) < 2:
        return run_layers(layers, h)
    segments = math.ceil(math.sqrt(len(layers)))
    return checkpoint_sequential(layers, segments, h, use_reentrant=False)


def default_methods(arch: str) -> list[str]:
    methods = ["e2e", "checkpoint", "offload"]
    methods += [f"{family}:{K}" for family in ("greedy", "infopro") for K in LOCAL_KS]
    methods += [f"infopro-balanced:{K}" for K in sorted(PAPER_SPLITS.get((arch, "balanced"), {}))]
    methods += [f"infopro+checkpoint:{K}" for K in (2, 4)]
    return methods


class StepTimer:
    """Times steps with CUDA events (no synchronisation until `seconds`), or the wall clock on CPU."""

    def __init__(self, device: torch.device):
        self.device, self.marks = device, []

    def _mark(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self):
        self.marks.append([self._mark(), None])

    def stop(self):
        self.marks[-1][1] = self._mark()

    def seconds(self) -> list[float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return [a.elapsed_time(b) / 1000 for a, b in self.marks]
        return [b - a for a, b in self.marks]


def measure(method: Method, arch: str, batch_size: int, precision: str, device: torch.device,
            steps: int, warmup: int) -> dict:
    """All measures of one method, in this process (call it in a fresh one)."""
    configure_backends(device)
    config = method.config(arch, batch_size, precision)
    net = place(build_net(config), device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    generator = torch.Generator(device=device).manual_seed(0)
    images = torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8, device=device, generator=generator)
    labels = torch.randint(0, 10, (batch_size,), device=device, generator=generator)

    def forward_backward():
        optimizer.zero_grad(set_to_none=True)
        with method.context(device):
            train_step(net, augmented_batch(images, generator), labels, precision, method.run_segment())

    for _ in range(warmup):
        forward_backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    timer = StepTimer(device)
    for _ in range(steps):
        timer.start()
        forward_backward()
        optimizer.step()
        timer.stop()
    step_seconds = sorted(timer.seconds())
    median = step_seconds[len(step_seconds) // 2]
    record = {"method": method.label, "family": method.family, "K": method.K,
              "step_seconds": median, "step_seconds_min": step_seconds[0], "step_seconds_max": step_seconds[-1],
              "images_per_second": batch_size / median}
    record |= cuda_memory(device)
    record |= device_independent_memory(method, forward_backward, device)
    record |= {"parameter_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
               "optimizer_state_bytes": sum(v.numel() * v.element_size() for state in optimizer.state.values()
                                            for v in state.values() if torch.is_tensor(v)),
               "batch_bytes": images.nbytes + labels.nbytes, "module_ends": ",".join(map(str, net.ends))}
    return record


def cuda_memory(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None, "device_used_bytes": None}
    free, total = torch.cuda.mem_get_info(device)
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "device_used_bytes": total - free}


def device_independent_memory(method: Method, forward_backward, device: torch.device) -> dict:
    """Exact peaks of one more step: all tensors it allocates, and its saved activations."""
    with PeakTensorMemory(device.type) as tensors:
        forward_backward()
    saved = None
    if not method.manages_saved_tensors:
        with SavedActivations() as counter:
            forward_backward()
        saved = counter.peak_bytes
    return {"peak_step_tensor_bytes": tensors.peak_bytes, "peak_saved_activation_bytes": saved}


def run_in_fresh_process(args: list[str], timeout: float) -> dict:
    """Run `python -m experiments.bench --worker ...` and parse the JSON line it prints last."""
    command = [sys.executable, "-m", "experiments.bench", *args]
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        message = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": message[:300]}
    return json.loads(lines[-1])


def worker_args(method: str, arch: str, batch_size: int, precision: str, device: str, steps: int,
                warmup: int) -> list[str]:
    return ["--worker", method, "--arch", arch, "--batch-size", str(batch_size), "--precision", precision,
            "--device", device, "--steps", str(steps), "--warmup", str(warmup)]


def run_methods(methods: list[str], arch: str, batch_size: int, precision: str, device: str, steps: int,
                warmup: int, timeout: float = 3600, log=print) -> pd.DataFrame:
    """Measure each method in a fresh process; a failing method gets its error, the rest go on."""
    rows = []
    for label in methods:
        Method.parse(label)  # refuse a bad name before spending any time
    for label in methods:
        row = {"method": label} | run_in_fresh_process(
            worker_args(label, arch, batch_size, precision, device, steps, warmup), timeout)
        rows.append(row)
        log(f"{label:<22} " + (f"error: {row['error']}" if "error" in row else
                               f"{1000 * row['step_seconds']:9.1f} ms/step  "
                               f"{row['peak_step_tensor_bytes'] / 2**20:9.1f} MiB step tensors"))
    return with_ratios(pd.DataFrame(rows))


RATIO_COLUMNS = ("step_seconds", "peak_allocated_bytes", "peak_reserved_bytes", "peak_step_tensor_bytes",
                 "peak_saved_activation_bytes")


def with_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """Add `<measure>_vs_e2e` = measure / E2E's measure, from the same invocation."""
    if "e2e" not in set(table["method"]):
        return table
    e2e = table.set_index("method").loc["e2e"]
    for column in RATIO_COLUMNS:
        if column in table and pd.notna(e2e.get(column)):
            table[f"{column}_vs_e2e"] = table[column].astype(float) / float(e2e[column])
    return table


def summary_table(table: pd.DataFrame) -> str:
    """A short human-readable table of the measures and their ratios to E2E."""
    def mib(value):
        return "" if pd.isna(value) else f"{value / 2**20:,.0f}"

    def pct(row, column):
        value = row.get(f"{column}_vs_e2e")
        return "" if value is None or pd.isna(value) else f"{100 * value:.0f}%"

    header = (f"{'method':<22}{'ms/step':>9}{'x E2E':>7}{'img/s':>9}{'alloc MiB':>11}{'%':>6}"
              f"{'step MiB':>10}{'%':>6}{'saved MiB':>11}{'%':>6}")
    lines = [header]
    for _, row in table.iterrows():
        if pd.notna(row.get("error")) and row.get("error"):
            lines.append(f"{row['method']:<22}error: {row['error']}")
            continue
        ratio = row.get("step_seconds_vs_e2e")
        lines.append(f"{row['method']:<22}{1000 * row['step_seconds']:>9.1f}"
                     f"{'' if ratio is None or pd.isna(ratio) else f'{ratio:.2f}':>7}"
                     f"{row['images_per_second']:>9.0f}{mib(row['peak_allocated_bytes']):>11}"
                     f"{pct(row, 'peak_allocated_bytes'):>6}{mib(row['peak_step_tensor_bytes']):>10}"
                     f"{pct(row, 'peak_step_tensor_bytes'):>6}{mib(row['peak_saved_activation_bytes']):>11}"
                     f"{pct(row, 'peak_saved_activation_bytes'):>6}")
    return "\n".join(lines)


def write_measurement(path: Path, rows: list[dict], context: dict) -> None:
    """A measurement's rows, each with its context (provenance), to a CSV; the rows printed as a table."""
    write_csv(path, [row | context for row in rows])
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"wrote {path}")


def device_slug(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")


def largest_fitting(fits, start: int = 32, limit: int = 1 << 16) -> int:
    """Largest batch size b with fits(b), assuming fits is monotone: doubling, then bisection to
    within 2% (or 8 images). Returns 0 when even `start` does not fit."""
    if not fits(start):
        return 0
    low, high = start, None
    while high is None:
        candidate = low * 2
        if candidate > limit:
            return low
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    while high - low > max(8, low // 50):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def max_batch(method: str, cap_gib: float, arch: str, precision: str, device: str, log=print) -> int:
    """Largest batch `method` trains with under a real CUDA allocation cap of `cap_gib` GiB."""
    def fits(batch_size):
        args = worker_args(method, arch, batch_size, precision, device, 1, 1) + ["--memory-cap", str(cap_gib)]
        ok = "error" not in run_in_fresh_process(args, timeout=900)
        log(f"  {method} batch {batch_size}: {'fits' if ok else 'does not fit'} in {cap_gib:g} GiB")
        return ok
    return largest_fitting(fits)
