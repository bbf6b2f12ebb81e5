"""Each benchmark measurement in a fresh process, so that no allocator state leaks from one method to the next.

`run_methods`, `run_profiles` and `max_batches` start `python -m infopro.bench_runner METHOD ...`
once per method; that process measures the one method (`infopro.bench`, `infopro.max_batch`) and
prints its record as one JSON line, which the caller parses. A method that fails gets its error in
its row, and the others go on.
"""

import argparse
import json
import subprocess
import sys

import pandas as pd

from infopro.bench import measure, profile_step, with_ratios
from infopro.bench_methods import Method
from infopro.cli import run
from infopro.device import resolve_device
from infopro.max_batch import cuda_peak_bytes, search_max_batches
from infopro.records import REPO_ROOT
from infopro.trace import CAUSES


def run_profiles(methods: list[str], arch: str, batch_size: int, precision: str, device: str, steps: int,
                 warmup: int, timeout: float = 3600, log=print) -> tuple[list[dict], list[dict]]:
    """Profile each method in a fresh process: one row per method and operator, or one with its error;
    and on CUDA one row per method of where the GPU's idle time goes, or its error (none on a CPU)."""
    rows, idle_rows = [], []
    for label in methods:
        found = run_in_fresh_process(worker_args(label, arch, precision, device, "--batch-size", str(batch_size),
                                                 "--steps", str(steps), "--warmup", str(warmup), "--profile"), timeout)
        if "error" in found:
            rows.append({"method": label, "error": found["error"]})
            if device == "cuda":  # its idle CSV records the failure too, as the profile's does
                idle_rows.append(rows[-1])
            log(f"{label:<22} error: {found['error']}")
            continue
        rows += [{"method": label} | operator for operator in found["operators"]]
        log(f"{label:<22} " + ", ".join(f"{operator['operator']} {100 * operator['share']:.0f}%"
                                        for operator in found["operators"][:3]))
        if idle := found["gpu_idle"]:
            idle_rows.append({"method": label} | idle)
            log(f"{'':<22} error: {idle['error']}" if "error" in idle else
                f"{'':<22} GPU idle {idle['idle_ms_per_step']:.1f} ms a step: "
                + ", ".join(f"{cause} {idle[f'idle_{cause}_ms_per_step']:.1f}" for cause in CAUSES)
                + f"; longest gap {idle['longest_gap_ms']:.1f} ms ({idle['longest_gap_cause'] or 'none'})")
    return rows, idle_rows


def run_in_fresh_process(args: list[str], timeout: float) -> dict:
    """Run `python -m infopro.bench_runner ARGS` and parse the JSON line it prints last."""
    command = [sys.executable, "-m", "infopro.bench_runner", *args]
    try:
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        message = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": message.removeprefix("error: ")[:300]}  # the caller prints its own "error: "
    return json.loads(lines[-1])


def worker_args(method: str, arch: str, precision: str, device: str, *options: str) -> list[str]:
    """The arguments of one worker process; `options` say what it measures."""
    return [method, "--arch", arch, "--precision", precision, "--device", device, *options]


def run_methods(methods: list[str], arch: str, batch_size: int, precision: str, device: str, steps: int,
                warmup: int, step_mode: str = "eager", timeout: float = 3600, log=print) -> pd.DataFrame:
    """Measure each method in a fresh process, its steps in `step_mode`; a failing method gets its error,
    the rest go on."""
    rows = []
    for label in methods:
        row = {"method": label} | run_in_fresh_process(
            worker_args(label, arch, precision, device, "--batch-size", str(batch_size), "--steps", str(steps),
                        "--warmup", str(warmup), "--step", step_mode), timeout)
        rows.append(row)
        log(f"{label:<22} " + (f"error: {row['error']}" if "error" in row else
                               f"{1000 * row['step_seconds']:9.1f} ms/step  "
                               f"{row['peak_step_tensor_bytes'] / 2**20:9.1f} MiB step tensors"))
    return with_ratios(pd.DataFrame(rows))


def max_batches(method: str, caps_gib: list[float], arch: str, precision: str, device: str) -> dict:
    """{"max_batch": [largest batch under each cap]} of `method` (or {"error": ...}), searched in one
    fresh process: one per method rather than per trial, so a full search fits in a GPU session.

    `offload` is not searched: its saved activations live in pinned host memory, which the
    cap does not bound, so its search would end only when the host ran out of memory.
    """
    if Method.parse(method).family == "offload":
        return {"error": "not searched: offload keeps activations in host memory, which a CUDA cap does not bound"}
    args = worker_args(method, arch, precision, device, "--search-caps", ",".join(map(str, caps_gib)))
    return run_in_fresh_process(args, timeout=3600)


def worker(argv=None) -> None:
    """Measure one method in this (fresh) process and print its record as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m infopro.bench_runner")
    p.add_argument("method")
    for name in ("--arch", "--precision", "--device"):
        p.add_argument(name, required=True)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--search-caps", type=lambda text: [float(cap) for cap in text.split(",")])
    p.add_argument("--profile", action="store_true")
    p.add_argument("--step", default="eager")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    method = Method.parse(args.method)
    if args.search_caps:
        peak_bytes = cuda_peak_bytes(method, args.arch, args.precision, device)
        record = {"max_batch": search_max_batches(peak_bytes, [cap * 2**30 for cap in args.search_caps])}
    elif args.profile:
        record = profile_step(method, args.arch, args.batch_size, args.precision, device, args.steps, args.warmup)
    else:
        record = measure(method, args.arch, args.batch_size, args.precision, device, args.steps, args.warmup,
                         args.step)
    print(json.dumps(record))


if __name__ == "__main__":
    run(worker)
