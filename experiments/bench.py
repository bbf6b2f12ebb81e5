"""Memory and speed of one training step for E2E, checkpointing, offload, greedy SL and InfoPro.

    python -m experiments.bench                                  # ResNet-110, batch 1024 (paper Table 3)
    python -m experiments.bench --arch resnet32 --methods e2e infopro:16
    python -m experiments.bench --max-batch 2,4,8 --methods e2e checkpoint infopro-balanced:4   # CUDA
    python -m experiments.bench --pipeline                       # our input pipeline vs a DataLoader
    python -m experiments.bench --device cpu --quick --out /tmp/b  # every method, tiny, on CPU

Feeds Table 3 and the memory figure (`make table3 fig_memory`). The paper (Titan Xp,
ResNet-110, batch 1024): E2E 9.40 GB; checkpointing 3.91 GB at +27.5% time; InfoPro* K=2/3/4
5.38 / 4.22 / 3.52 GB at +1.1 / 7.5 / 13.4%. Each method runs in a fresh process; see
infopro/bench.py for what is measured and how. GPU time of the full run: not yet measured.
On 2 CPU cores a ResNet-110 step at batch 1024 takes about 30 s: the committed CPU run used
--steps 2 --warmup 1 and eight methods (22 min, with the --pipeline comparison).
"""

import argparse
import json
from pathlib import Path

import pandas as pd
import torch

from infopro.bench import Method, default_methods, device_slug, max_batch, measure, run_methods, summary_table
from infopro.cli import ArgumentParser, run
from infopro.errors import InfoProError
from infopro.models import ARCHS
from infopro.pipeline import compare_pipelines
from infopro.records import provenance, write_csv
from infopro.train import PRECISIONS, resolve_device

QUICK = {"batch_size": 32, "steps": 3, "warmup": 1, "pipeline_images": 512}
FULL = {"batch_size": 1024, "steps": 20, "warmup": 5, "pipeline_images": 50000}


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="resnet110", choices=ARCHS)
    p.add_argument("--batch-size", type=int, help="default 1024 (32 with --quick)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--methods", nargs="+", help="default: every method defined for --arch")
    p.add_argument("--steps", type=int, help="timed steps per method (default 20; 3 with --quick)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 5; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny settings, for CPU and CI")
    p.add_argument("--max-batch", metavar="GIB,...", help="also find each method's largest batch under these CUDA caps")
    p.add_argument("--pipeline", action="store_true", help="also time one epoch of our pipeline vs a DataLoader")
    p.add_argument("--pipeline-images", type=int, help="images in that epoch (default 50000; 512 with --quick)")
    p.add_argument("--out", default="results/bench", help="folder for the CSVs")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--memory-cap", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def worker(args) -> None:
    """Measure one method in this (fresh) process and print its record as one JSON line."""
    device = resolve_device(args.device)
    if args.memory_cap is not None:
        if device.type != "cuda":
            raise InfoProError("--memory-cap needs CUDA")
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap * 2**30 / total), device)
    record = measure(Method.parse(args.worker), args.arch, args.batch_size, args.precision, device,
                     args.steps, args.warmup)
    print(json.dumps(record))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    device = resolve_device(args.device)
    if args.max_batch and device.type != "cuda":
        raise InfoProError("--max-batch searches under a real CUDA allocation cap; it needs --device cuda")
    methods = args.methods or default_methods(args.arch)
    context = {"arch": args.arch, "batch_size": args.batch_size, "precision": args.precision,
               "steps": args.steps, "warmup": args.warmup} | provenance(device)
    stem = Path(args.out) / f"{args.arch}-b{args.batch_size}-{args.precision}-{device_slug(device)}"
    table = run_methods(methods, args.arch, args.batch_size, args.precision, device.type, args.steps,
                        args.warmup)
    write_csv(f"{stem}.csv", table.assign(**context).to_dict("records"))
    print(summary_table(table))
    print(f"wrote {stem}.csv")
    if args.max_batch:
        rows = [{"method": method, "cap_gib": cap,
                 "max_batch": max_batch(method, cap, args.arch, args.precision, device.type)} | context
                for cap in (float(c) for c in args.max_batch.split(",")) for method in methods]
        write_csv(f"{stem}-maxbatch.csv", rows)
        print(pd.DataFrame(rows).pivot(index="method", columns="cap_gib", values="max_batch"))
    if args.pipeline:
        result = compare_pipelines("resnet32", args.pipeline_images, args.batch_size, device) | provenance(device)
        write_csv(Path(args.out) / f"pipeline-resnet32-b{args.batch_size}-{device_slug(device)}.csv", [result])
        print(f"one E2E ResNet-32 epoch of {args.pipeline_images} images: ours {result['ours_epoch_seconds']:.2f} s, "
              f"reference {result['reference_epoch_seconds']:.2f} s ({result['reference_transforms']}), "
              f"speed-up {result['speedup']:.1f}x")


if __name__ == "__main__":
    run(main)
