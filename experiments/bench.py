"""Memory and speed of one training step for E2E, checkpointing, offload, greedy SL, DGL and InfoPro.

    python -m experiments.bench                                  # ResNet-110, batch 1024 (paper Table 3)
    python -m experiments.bench --arch resnet32 --methods e2e infopro:16
    python -m experiments.bench --measure max-batch --caps 2,4,8 --methods e2e checkpoint infopro-balanced:4  # CUDA
    python -m experiments.bench --measure steps pipeline         # + our input pipeline vs a DataLoader
    python -m experiments.bench --measure work --device cpu      # FLOPs, operators, bytes per step (any device)
    python -m experiments.bench --measure profile --methods e2e infopro-balanced:4  # where a step's time goes
    python -m experiments.bench --step compiled                  # the step table, modules compiled (CUDA)
    python -m experiments.bench --device cpu --quick --out /tmp/b  # every method, tiny, on CPU

Feeds Table 3 and the memory figure (`make table3 fig_memory`). The paper (Titan Xp,
ResNet-110, batch 1024): E2E 9.40 GB; checkpointing 3.91 GB at +27.5% time; InfoPro* K=2/3/4
5.38 / 4.22 / 3.52 GB at +1.1 / 7.5 / 13.4%. Each method runs in a fresh process; see
infopro/bench.py for what is measured and how. On one H100 the step table and the pipeline
comparison took 5.7 min together.
On 2 CPU cores a ResNet-110 step at batch 1024 takes about 30 s: the committed CPU run used
--steps 2 --warmup 1 and eight methods (22 min, with the pipeline comparison). A step's FLOPs
depend on shapes only; the committed work counts were made on the CPU, one step per method.
"""

import time
from pathlib import Path

import pandas as pd

from infopro.bench import count_work, summary_table
from infopro.bench_methods import Method, default_methods
from infopro.bench_runner import max_batches, run_methods, run_profiles
from infopro.cli import ArgumentParser, at_least, positive, run
from infopro.config import PRECISIONS
from infopro.device import configure_backends, resolve_device
from infopro.errors import InfoProError
from infopro.models import ARCHS
from infopro.pipeline import compare_pipelines
from infopro.records import check_writable, device_slug, provenance, write_csv

MEASUREMENTS = ("steps", "max-batch", "pipeline", "work", "profile")
QUICK = {"batch_size": 32, "steps": 3, "warmup": 1, "pipeline_images": 512}
FULL = {"batch_size": 1024, "steps": 20, "warmup": 5, "pipeline_images": 50000}


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="resnet110", choices=ARCHS)
    p.add_argument("--batch-size", type=at_least(1), help="default 1024 (32 with --quick)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--methods", nargs="+", help="default: every method defined for --arch")
    p.add_argument("--steps", type=at_least(1), help="timed steps per method (default 20; 3 with --quick)")
    p.add_argument("--warmup", type=at_least(0), help="untimed steps first (default 5; 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny settings, for CPU and CI")
    p.add_argument("--measure", nargs="+", default=["steps"], choices=MEASUREMENTS,
                   help="steps: the step table (default); max-batch: each method's largest batch under "
                        "--caps (CUDA); pipeline: one epoch of our pipeline vs a DataLoader; work: each "
                        "method's FLOPs, operators and bytes accessed per step (one untimed step each, E2E's "
                        "always); profile: "
                        "the operators a step's time goes to (--steps profiled steps after --warmup) and, "
                        "on CUDA, where the GPU's idle time goes")
    p.add_argument("--step", default="eager", choices=("eager", "compiled"),
                   help="with --measure steps: compiled times each method with its local modules under "
                        "torch.compile (the grids' training mode on a GPU) into OUT/compiled/; checkpointing "
                        "and offloading step eagerly only (default: eager, the paper's kind of step)")
    p.add_argument("--caps", metavar="GIB,...", type=gib_list, default=[2.0, 4.0, 8.0],
                   help="CUDA allocation caps for --measure max-batch (default 2,4,8)")
    p.add_argument("--pipeline-images", type=at_least(1), help="images in that epoch (default 50000; 512 with --quick)")
    p.add_argument("--out", default="results/bench", help="folder for the CSVs")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def gib_list(text: str) -> list[float]:
    """'2,4,8' -> [2.0, 4.0, 8.0] (GiB), for argparse: each cap a finite number above 0."""
    return [positive(cap) for cap in text.split(",")]


def max_batch_rows(methods: list[str], caps: list[float], args, context: dict) -> list[dict]:
    """One row per method and cap: the largest batch that trains under the cap (0: none), or the error."""
    rows = []
    for method in methods:
        began = time.perf_counter()
        found = max_batches(method, caps, args.arch, args.precision, "cuda")
        batches = found.get("max_batch", [None] * len(caps))
        rows += [{"method": method, "cap_gib": cap, "max_batch": batch, "error": found.get("error")} | context
                 for cap, batch in zip(caps, batches)]
        print(f"{method:<22} " + (f"error: {found['error']}" if "error" in found else
                                  "  ".join(f"{cap:g} GiB: {batch}" for cap, batch in zip(caps, batches)))
              + f"  ({time.perf_counter() - began:.0f} s)")
    return rows


def write_steps(args, methods: list[str], device, context: dict, stem: Path) -> None:
    """Every method's step time and memory, each in a fresh process: the step table, STEM.csv."""
    table = run_methods(methods, args.arch, args.batch_size, args.precision, device.type, args.steps,
                        args.warmup, args.step)
    write_csv(f"{stem}.csv", table.assign(**context).to_dict("records"))
    print(summary_table(table))
    print(f"wrote {stem}.csv")


def write_max_batch(args, methods: list[str], device, context: dict, stem: Path) -> None:
    """The largest batch of each method under each CUDA allocation cap: ...-maxbatch.csv."""
    search_context = {key: value for key, value in context.items() if key not in ("batch_size", "steps", "warmup")}
    rows = max_batch_rows(methods, args.caps, args, search_context)
    path = Path(args.out) / f"{args.arch}-{args.precision}-{device_slug(device)}-maxbatch.csv"
    write_csv(path, rows)
    print(pd.DataFrame(rows).pivot(index="method", columns="cap_gib", values="max_batch"))
    print(f"wrote {path}")


def write_work(args, methods: list[str], device, context: dict, stem: Path) -> None:
    """The FLOPs, operators and bytes of one step of each method, and of E2E's: work-....csv."""
    counted = methods if "e2e" in methods else ["e2e", *methods]  # the ratios need E2E, counted alike
    table = count_work(counted, args.arch, args.batch_size, args.precision, device)
    path = Path(args.out) / f"work-{args.arch}-b{args.batch_size}.csv"
    write_csv(path, table.assign(**{key: value for key, value in context.items() if key not in ("steps", "warmup")})
              .to_dict("records"))
    print(f"wrote {path}")


def write_profiles(args, methods: list[str], device, context: dict, stem: Path) -> None:
    """Which operators a step's time goes to (profile-STEM.csv) and, on a GPU, its idle time (idle-STEM.csv)."""
    rows, idle_rows = run_profiles(methods, args.arch, args.batch_size, args.precision, device.type, args.steps,
                                   args.warmup)
    for path, table in ((Path(args.out) / f"profile-{stem.name}.csv", rows),
                        (Path(args.out) / f"idle-{stem.name}.csv", idle_rows)):
        if table:  # no idle rows on a CPU: it has no timeline of its own to read gaps from
            write_csv(path, [row | context for row in table])
            print(f"wrote {path}")


def write_pipeline(args, methods: list[str], device, context: dict, stem: Path) -> None:
    """One E2E ResNet-32 epoch through our input pipeline against a DataLoader: pipeline-....csv."""
    result = compare_pipelines("resnet32", args.pipeline_images, args.batch_size, device,
                               args.precision) | provenance(device)
    write_csv(Path(args.out) / f"pipeline-resnet32-b{args.batch_size}-{args.precision}-{device_slug(device)}.csv",
              [result])
    print(f"one E2E ResNet-32 epoch of {args.pipeline_images} images: ours {result['ours_epoch_seconds']:.2f} s, "
          f"reference {result['reference_epoch_seconds']:.2f} s ({result['reference_transforms']}), "
          f"speed-up {result['speedup']:.1f}x")


# Each measurement's writer, in the order a call that asks for several runs them.
WRITERS = {"steps": write_steps, "max-batch": write_max_batch, "work": write_work, "profile": write_profiles,
           "pipeline": write_pipeline}


def main(argv=None):
    args = parse_args(argv)
    methods = args.methods or default_methods(args.arch)
    for label in methods:
        Method.parse(label).check(args.arch)  # refuse a bad method before spending any time
    check_writable(args.out)
    device = resolve_device(args.device)
    if "max-batch" in args.measure and device.type != "cuda":
        raise InfoProError("--measure max-batch searches under a real CUDA allocation cap; it needs --device cuda")
    if args.step == "compiled" and args.measure != ["steps"]:
        raise InfoProError("--step compiled times steps only: give it with --measure steps alone")
    configure_backends(device)  # as each worker does, so that the provenance below records their settings
    context = {"arch": args.arch, "batch_size": args.batch_size, "precision": args.precision,
               "steps": args.steps, "warmup": args.warmup} | provenance(device)
    stem = Path(args.out) / f"{args.arch}-b{args.batch_size}-{args.precision}-{device_slug(device)}"
    if args.step == "compiled":  # beside the eager step table of the same name, which it must not replace
        stem = stem.parent / "compiled" / stem.name
        check_writable(stem.parent)
    for measure, write in WRITERS.items():
        if measure in args.measure:
            write(args, methods, device, context, stem)


if __name__ == "__main__":
    run(main)
