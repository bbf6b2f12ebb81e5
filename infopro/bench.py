"""Memory and speed of one training step, under one protocol, for every family of memory saving.

The methods are `infopro.bench_methods`'s; each is measured in a fresh process (`infopro.bench_runner`),
so no allocator state leaks between them.

Measures per method, after warm-up steps (which include cuDNN's autotuning):
median step time (CUDA events, no per-step synchronisation; wall clock on CPU) and images/s;
`max_memory_allocated` / `max_memory_reserved` after `reset_peak_memory_stats()`; the
device's used memory from cudaMemGetInfo (includes the CUDA context and everything else on
the GPU: never model memory); and two device-independent, exact measures of one step:
the peak bytes of tensors allocated during forward+backward (`PeakTensorMemory`) and the
peak saved-activation bytes (`SavedActivations`; not defined for checkpoint/offload, which
manage saved tensors themselves). Parameters, gradients-to-be and optimizer state are
reported separately; the benchmark holds one batch, not a dataset, on the device.

Work (`step_work`), three counts of one step, forward and backward with any recomputation:
`step_flops`, the FLOPs of its convolutions and matrix products (`torch.utils.flop_counter`);
`step_operators`, the ATen operators it dispatches, views excluded (a proxy for kernel launches);
`step_bytes_accessed`, the bytes of those operators' inputs and outputs (the memory traffic if
nothing were fused or cached). FLOPs and bytes depend on shapes only, so counts made on the CPU
hold on every device; operators are those dispatched on the counting device. Offload's operators
and bytes count only on a GPU, where its copies to host memory happen. Set beside step times,
they say which kind of work a method's time overhead follows.

Profile (`profile_step`): where a step's time goes, per ATen operator: its calls and its self
time on the device (the kernels it launched; on a CPU its own time) per step, from
`torch.profiler` over a few steps after warm-up; the operators that take the most of it. On CUDA
also where the GPU's idle time in those steps goes, read from the trace's timeline
(`infopro.trace`: waiting for the host's dispatch, a synchronisation, the allocator, or queued).

The largest batch under a memory cap: `infopro.max_batch`.
"""

import gc
import time
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from infopro.augment import augmented_batch
from infopro.bench_methods import Method
from infopro.config import build_net
from infopro.device import configure_backends, place
from infopro.errors import InfoProError
from infopro.memory import PeakTensorMemory, SavedActivations
from infopro.records import write_csv
from infopro.step import compile_modules, train_step
from infopro.trace import gpu_idle, trace_spans


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


def prepare_step(method: Method, arch: str, batch_size: int, precision: str, device: torch.device,
                 step_mode: str = "eager"):
    """A network, its optimizer, one resident batch and the step's forward+backward (no optimizer step),
    its local modules compiled in the compiled step mode (`forward_backward(modules=None)` steps eagerly)."""
    if step_mode == "compiled" and method.manages_saved_tensors:
        raise InfoProError(f"{method.label} steps eagerly only: torch.compile does not trace checkpoint_sequential, "
                           "and would bypass offloading's saved-tensor hooks")
    configure_backends(device)
    net = place(build_net(method.config(arch, batch_size, precision)), device)
    compiled = compile_modules(net.local_modules) if step_mode == "compiled" else None
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    generator = torch.Generator(device=device).manual_seed(0)
    images = torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8, device=device, generator=generator)
    labels = torch.randint(0, 10, (batch_size,), device=device, generator=generator)

    def forward_backward(modules=compiled):
        optimizer.zero_grad(set_to_none=True)
        with method.context(device):
            train_step(net, augmented_batch(images, generator), labels, precision, method.run_segment(), modules)

    return net, optimizer, images.nbytes + labels.nbytes, forward_backward


def measure(method: Method, arch: str, batch_size: int, precision: str, device: torch.device,
            steps: int, warmup: int, step_mode: str = "eager") -> dict:
    """All measures of one method, in this process (call it in a fresh one). In the compiled step mode the
    warm-up steps compile and the timed steps and CUDA peaks are the compiled ones'; the exact tensor
    measures stay those of an eager step, the math they are defined on."""
    net, optimizer, batch_bytes, forward_backward = prepare_step(method, arch, batch_size, precision, device,
                                                                 step_mode)
    for _ in range(warmup):
        forward_backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    allocator_before = allocator_calls(device)
    timer = StepTimer(device)
    for _ in range(steps):
        timer.start()
        forward_backward()
        optimizer.step()
        timer.stop()
    step_seconds = sorted(timer.seconds())
    allocator_after = allocator_calls(device)
    median = step_seconds[len(step_seconds) // 2]
    record = {"method": method.label, "family": method.family, "K": method.K, "step_mode": step_mode,
              "step_seconds": median, "step_seconds_min": step_seconds[0], "step_seconds_max": step_seconds[-1],
              "images_per_second": batch_size / median}
    record |= cuda_memory(device)
    record |= {f"{key}_in_timed_steps": None if value is None else allocator_after[key] - value
               for key, value in allocator_before.items()}
    record |= device_independent_memory(method, partial(forward_backward, modules=None), device)
    record |= {"parameter_bytes": sum(p.numel() * p.element_size() for p in net.parameters()),
               "optimizer_state_bytes": sum(v.numel() * v.element_size() for state in optimizer.state.values()
                                            for v in state.values() if torch.is_tensor(v)),
               "batch_bytes": batch_bytes, "module_ends": ",".join(map(str, net.ends))}
    return record


def cuda_memory(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None, "device_used_bytes": None}
    free, total = torch.cuda.mem_get_info(device)
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "device_used_bytes": total - free}


def allocator_calls(device: torch.device) -> dict:
    """How often CUDA's caching allocator has called cudaMalloc and cudaFree (which synchronises the
    device) and retried after freeing its cache, so far: in a steady state none of them happen, and
    any during timed steps would leave the GPU idle (None on a CPU)."""
    stats = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
    return {"cuda_mallocs": stats.get("segment.all.allocated"), "cuda_frees": stats.get("segment.all.freed"),
            "allocator_retries": stats.get("num_alloc_retries")}


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


class OperatorTally(TorchDispatchMode):
    """Counts the ATen operators run inside it, views excluded (they launch no kernel), and the
    bytes of their tensor inputs and outputs (each op reading and writing memory, none fused)."""

    def __init__(self):
        super().__init__()
        self.operators = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view:
            self.operators += 1
            self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                              if isinstance(t, torch.Tensor))
        return out


def step_work(method: Method, arch: str, batch_size: int, precision: str, device: torch.device) -> dict:
    """FLOPs, operators and bytes accessed of one step, forward and backward, recomputation included.

    FLOPs are those of convolutions and matrix products (`torch.utils.flop_counter`: elementwise
    work, normalisation, pooling and up-sampling are not counted). Offload's operators and bytes are
    left empty off a GPU, where its copies to host memory do not happen.
    """
    _, _, _, forward_backward = prepare_step(method, arch, batch_size, precision, device)
    with FlopCounterMode(display=False) as flops, OperatorTally() as tally:
        forward_backward()
    moves_nothing = method.family == "offload" and device.type != "cuda"
    return {"step_flops": flops.get_total_flops(), "step_operators": None if moves_nothing else tally.operators,
            "step_bytes_accessed": None if moves_nothing else tally.bytes}


def count_work(methods: list[str], arch: str, batch_size: int, precision: str, device: torch.device,
               log=print) -> pd.DataFrame:
    """`step_work` of each method, in this process: a count has no allocator state to isolate."""
    rows = []
    for label in methods:
        method = Method.parse(label)
        rows.append({"method": label, "family": method.family, "K": method.K}
                    | step_work(method, arch, batch_size, precision, device))
        log(f"{label:<22} {rows[-1]['step_flops'] / 1e9:9.1f} GFLOP  {rows[-1]['step_operators'] or '':>6} operators")
        gc.collect()
    return with_ratios(pd.DataFrame(rows))


PROFILE_TOP = 25  # operators kept per method: the rest of a step's time is in its `share` complement


def profile_step(method: Method, arch: str, batch_size: int, precision: str, device: torch.device, steps: int,
                 warmup: int, top: int = PROFILE_TOP) -> dict:
    """`operators`: the `top` operators by self time per step on `device`, over `steps` profiled steps
    after `warmup`; `gpu_idle`: on CUDA, where the GPU's idle time in those steps goes (`infopro.trace`).

    Why: the time overheads of local learning and checkpointing follow their operator counts, not
    their FLOPs; a profile says which operators the time goes to. On CUDA an operator's self time
    is that of the kernels it launched (the GPU's busy time, idle gaps excluded); on a CPU, its own.
    The idle gaps are read from the same trace's timeline.
    """
    _, optimizer, _, forward_backward = prepare_step(method, arch, batch_size, precision, device)
    for _ in range(warmup):
        forward_backward()
        optimizer.step()
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)  # so that no warm-up kernel runs into the profiled window
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])) as profiler:
        for _ in range(steps):
            forward_backward()
            optimizer.step()
        if on_cuda:
            torch.cuda.synchronize(device)
    self_time = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    operators = [event for event in profiler.key_averages()  # kernels are listed apart: not counted twice
                 if event.device_type == DeviceType.CPU and getattr(event, self_time) > 0]
    total = sum(getattr(event, self_time) for event in operators)
    operators.sort(key=lambda event: getattr(event, self_time), reverse=True)
    return {"operators": [{"operator": event.key, "calls_per_step": event.count / steps,
                           "self_ms_per_step": getattr(event, self_time) / 1000 / steps,
                           "share": getattr(event, self_time) / total} for event in operators[:top]],
            "gpu_idle": idle_or_error(profiler.events(), steps)}


def idle_or_error(events, steps: int) -> dict:
    """`infopro.trace.gpu_idle` of a profile's events ({} on a CPU: no GPU activity), or the error that
    stopped it: the operators of the same profile stand without it, and a recorded failure is not
    retried at the cost of every GPU call."""
    try:
        return gpu_idle(*trace_spans(events), steps)
    except Exception as error:  # any: the analysis is new on every trace it reads
        return {"error": f"idle analysis: {type(error).__name__}: {error}"}


RATIO_COLUMNS = ("step_seconds", "peak_allocated_bytes", "peak_reserved_bytes", "peak_step_tensor_bytes",
                 "peak_saved_activation_bytes", "step_flops", "step_operators", "step_bytes_accessed")


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


