"""I(h,y) and I(h,x) per layer point in the paper's units (fig10): the remainder estimator, on a GPU.

    python -m analysis.remainder ceiling --reference cifar10-jpeg-resnet32-e2e-K1-s0 --candidates 30 45 60
    python -m analysis.remainder layers --only cifar10-jpeg-resnet32-e2e-K1-s0 cifar10-jpeg-resnet32-greedy-K4-s0

`ceiling` trains the network's architecture from the image itself (h = x) with the estimator's
budget, shortest candidate first, until it comes within 2 points of the reference network's own
test accuracy; rows go to results/analysis/remainder_ceiling.csv. `layers` then trains, for every
layer point of each run, a fresh copy of the rest of the network on the frozen h, and InfoPro's
decoder beside it, with the shortest budget that passed (or --epochs); one row per (run, layer
point) goes to results/analysis/mutual_information.csv with estimator "remainder", written after
each run. What the paper's figure shows for greedy SL: I(h,y) falls at the first module ends and is
not regained; for E2E it stays level from the stem on. Cost: the sixteen remainders of a ResNet-32
are about eight ResNet-32s of work per batch, so one network takes about eight times a ResNet-32
trained alone for the same epochs (about 7.7 min for 30 epochs on an H200, 18 h on 2 CPU cores);
`--layers` estimates some points, and a later call the rest. `--layers key` estimates layer 1, the
module ends and the last layer, where the paper's argument is read (every layer of E2E, the
reference at each K's module ends): a fifth of the work at K = 2, a third at K = 4, three
fifths at K = 8.

    python -m analysis.remainder steps --reference cifar10-jpeg-resnet32-e2e-K1-s0

`steps` times an epoch of a pass over every layer point of that network with eager steps and
with CUDA-graphed ones, side by side on a GPU, and writes results/bench/remainder-steps-<gpu>.csv;
`--step graphed` then runs `ceiling` and `layers` graphed (the same numbers: docs/analysis.md).

    python -m analysis.remainder budget --reference cifar10-jpeg-resnet32-e2e-K1-s0 --layers 1,8,16

`budget` asks whether the figure's budget sets its values: the given layer points of that run again
with a longer budget (--epochs, default twice the figure's), and the ceiling with it unless one was
measured there against any network of the run's recipe (the ceiling never reads a network's
features); the ceiling's row goes to remainder_ceiling.csv beside the others, the points' rows to
results/analysis/remainder_budget.csv, which `make table_remainder_budget` sets beside the figure's.
Every other setting must be those of the figure's rows of that run (the CPU fixture's: `--batch-size
128 --lr 0.1 --precision fp32`); a check that would stand beside none of them is refused before any pass.
"""

from dataclasses import replace
from pathlib import Path

from analysis.probe import LAYERS_HELP, layer_list
from infopro.analysis import (analyse_runs, chosen_epochs, measure_ceilings, recipe_ceiling, remainder_run,
                              remainder_settings, remainder_steps_run)
from infopro.cli import ArgumentParser, at_least, positive, run
from infopro.config import PRECISIONS
from infopro.device import resolve_device
from infopro.errors import InfoProError
from infopro.records import check_writable, device_slug, read_table, write_csv
from infopro.remainder import STEPS, RemainderSettings
from infopro.remainder_budget import check_figure_settings
from infopro.remainder_steps import steps_csv
from infopro.runs import Run, finished_runs

CEILINGS = "results/analysis/remainder_ceiling.csv"
FIGURE = "results/analysis/mutual_information.csv"


def settings_from(args) -> RemainderSettings:
    return RemainderSettings(batch_size=args.batch_size, lr=args.lr, precision=args.precision)


def parse_args(argv=None):
    defaults = RemainderSettings()
    p = ArgumentParser(prog="python -m analysis.remainder", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    ceiling = commands.add_parser("ceiling", help="choose the budget: the ceiling against a trained network")
    ceiling.add_argument("--reference", required=True, metavar="TEXT", help="the run (id contains TEXT) whose "
                         "test accuracy the ceiling must come within 2 points of")
    ceiling.add_argument("--candidates", type=at_least(1), nargs="+", default=[defaults.epochs], metavar="EPOCHS")
    layers = commands.add_parser("layers", help="I(h,y) and I(h,x) at every layer point of each run")
    layers.add_argument("--only", nargs="+", metavar="TEXT", help="estimate only runs whose id contains TEXT")
    layers.add_argument("--layers", type=layer_list, metavar="L1,L2", help=LAYERS_HELP)
    layers.add_argument("--epochs", type=at_least(1), help="budget (default: the shortest whose ceiling passed)")
    layers.add_argument("--force", action="store_true", help="redo runs already in the CSV")
    layers.add_argument("--out", default=FIGURE)
    budget = commands.add_parser("budget",
                                 help="some layer points, and their recipe's ceiling, again with a longer budget")
    budget.add_argument("--reference", required=True, metavar="TEXT", help="the run (id contains TEXT) estimated")
    budget.add_argument("--layers", type=layer_list, required=True, metavar="L1,L2",
                        help="layer points L1,L2,... or 'key': layer 1, the run's module ends and its last")
    budget.add_argument("--epochs", type=at_least(1), help="the longer budget (default: twice the figure's)")
    budget.add_argument("--force", action="store_true", help="redo layer points already in the CSV")
    budget.add_argument("--out", default="results/analysis/remainder_budget.csv")
    budget.add_argument("--figure", default=FIGURE, help="fig10's rows (`layers`' CSV), which the longer budget's "
                        "stand beside: the reference's must share every setting but the epochs, checked first")
    steps = commands.add_parser("steps", help="seconds per epoch of a pass, eager against CUDA-graphed steps")
    steps.add_argument("--reference", required=True, metavar="TEXT", help="the run (id contains TEXT) timed")
    steps.add_argument("--out", default="results/bench", help="folder of remainder-steps-<gpu>.csv")
    for command in (ceiling, layers, budget, steps):
        command.add_argument("--runs", default="results/runs", help="folder searched for finished runs")
        command.add_argument("--batch-size", type=at_least(2), default=defaults.batch_size)
        command.add_argument("--lr", type=positive, default=defaults.lr, help="peak SGD learning rate")
        command.add_argument("--precision", choices=PRECISIONS, default=defaults.precision)
        command.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
        command.add_argument("--data-root", help="folder or archive of the runs' dataset")
    for command in (ceiling, layers, budget):
        command.add_argument("--ceilings", default=CEILINGS, help="the ceiling CSV, written or read")
        command.add_argument("--step", choices=STEPS, default="eager", help="how a pass's steps run (graphed: CUDA "
                             "graphs, the same numbers; `steps` measures which is faster)")
    return p.parse_args(argv)


def reference_run(runs, text: str) -> Run:
    reference = finished_runs(runs, [text])
    if len(reference) != 1:
        raise InfoProError(f"--reference {text!r} matches {len(reference)} runs; name one")
    return reference[0]


def figure_epochs(run: Run, args, settings: RemainderSettings) -> int:
    """The figure's budget for `run`: the shortest whose ceiling came within 2 points of a network of
    `run`'s architecture and recipe (other settings as `settings`)."""
    return chosen_epochs(args.ceilings, settings, {key: run.row()[key] for key in ("arch", "recipe")})


def budget_of(run: Run, args, settings: RemainderSettings) -> RemainderSettings:
    """`settings` with --epochs, else with the figure's budget."""
    return replace(settings, epochs=args.epochs or figure_epochs(run, args, settings))


def estimate_layers(runs: list[Run], args, budgets: dict, device) -> None:
    """The remainder rows of each run's --layers at its budget (`budgets`: run id -> settings), into --out."""
    analyse_runs(runs, args.out,
                 lambda r, points: remainder_run(r, points, settings=budgets[r.run_id], device=device,
                                                 data_root=args.data_root, step=args.step),
                 lambda r: remainder_settings(r, budgets[r.run_id]), args.layers, force=args.force)


def longer_budget(args, settings: RemainderSettings, device) -> None:
    """`budget`: --reference's --layers at the longer budget, and its recipe's ceiling there unless measured."""
    reference = reference_run(args.runs, args.reference)
    if not Path(args.figure).is_file():
        raise InfoProError(f"{args.figure} is missing: estimate the reference's layer points first (`layers`)")
    check_figure_settings(read_table(args.figure, "restore it from git, or estimate the layer points again (`layers`)",
                                     ("run_id", "estimator")), reference.run_id, settings)
    longer = replace(settings, epochs=args.epochs or 2 * figure_epochs(reference, args, settings))
    recipe_ceiling(reference, longer, args.ceilings, device, args.data_root, step=args.step)
    estimate_layers([reference], args, {reference.run_id: longer}, device)


def main(argv=None):
    args = parse_args(argv)
    device, settings = resolve_device(args.device), settings_from(args)
    if args.command == "steps":
        check_writable(args.out)
        rows = remainder_steps_run(reference_run(args.runs, args.reference), settings, device, args.data_root)
        path = steps_csv(args.out, device_slug(device))
        write_csv(path, rows)
        print(f"wrote {path}")
        return
    if args.command == "ceiling":
        chosen = measure_ceilings(reference_run(args.runs, args.reference), args.candidates, args.ceilings, settings,
                                  device, args.data_root, step=args.step)
        if chosen is None:
            raise InfoProError(f"no candidate budget brought the ceiling within 2 points (rows in {args.ceilings}); "
                               "try longer ones")
        print(f"budget: {chosen} epochs")
        return
    if args.command == "budget":
        longer_budget(args, settings, device)
        return
    runs = finished_runs(args.runs, args.only)
    # Every budget is settled (or refused) before any pass; runs without weights are skipped, so need none.
    estimate_layers(runs, args, {run.run_id: budget_of(run, args, settings) for run in runs if run.has_weights},
                    device)


if __name__ == "__main__":
    run(main)
