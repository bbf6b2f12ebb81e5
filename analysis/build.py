"""Build figures and tables from files under results/ only (never trains): what `make figN` runs.

    python -m analysis.build fig8            # results/figures/fig8.png and .pdf
    python -m analysis.build fig7 fig10 table2
    python -m analysis.build fig8 --recipe fixture        # the 12-epoch CPU toy: results/figures/fig8-fixture.png
    python -m analysis.build claims --recipe fixture      # the paper's claims judged on it: tables/claims-fixture.md
    python -m analysis.build fig8 table2 --arch resnet110  # results/figures/fig8-resnet110.png, ...
    python -m analysis.build fig10 --alternatives          # fig10.png, and fig10-<estimator>.png of the other one

fig7: test error vs K (Table 2's runs); fig8: linear separability per layer (linear_probe.csv);
fig10: I(h,x) and I(h,y) per layer (mutual_information.csv); fig_info_plane: the same rows as paths
through the information plane, the methods of each K in one panel; fig_curves: train and test
error per epoch of every run, unfinished ones included (metrics.csv); table2: ours vs the paper;
fig_memory and table3: the memory benchmark (bench/); table_schedule: the same runs at two
schedule lengths (schedule-check/ beside runs/); table_paired: InfoPro against greedy SL image by
image on test images no run used (test_predictions.csv); table_e2e_gap: greedy SL and InfoPro
against E2E the same way; table_ranking: each step of the paper's ranking (InfoPro (Contrast) <
InfoPro (Softmax) < DGL < greedy SL) the same way; table_remainder_budget: the remainder estimator's
points again with a longer budget beside the figure's (remainder_budget.csv), per network, and
table_remainder_budget_means: the same over seeds.
Each takes a few seconds on a CPU.
"""

from infopro.cli import ArgumentParser, run
from infopro.figures import ESTIMATOR_TARGETS, ESTIMATORS, TARGETS, RowPicker, build, load_mutual_info
from infopro.models import ARCHS
from infopro.selection import other_estimators


def main(argv=None):
    p = ArgumentParser(prog="python -m analysis.build", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="+", choices=TARGETS)
    p.add_argument("--results", default="results", help="the results folder to read and write")
    p.add_argument("--recipe", metavar="TEXT",
                   help="fig7, fig8, fig10, fig_info_plane, fig_curves, table2, claims: show the recipe whose "
                        "label contains TEXT, or 'fixture' (the 12-epoch CPU toy), instead of the paper's, as "
                        "<target>-<TEXT>")
    p.add_argument("--arch", choices=ARCHS,
                   help="fig7, fig8, fig10, fig_info_plane, fig_curves, table2: show this network's runs instead of those of the "
                        "network covering the most configurations, as <target>-<ARCH>")
    estimators = p.add_mutually_exclusive_group()
    estimators.add_argument("--estimator", choices=ESTIMATORS,
                            help="fig10, fig_info_plane: draw this estimator of I(h,x), I(h,y) (default: remainder "
                                 "once it covers E2E and greedy SL at layer 1, their module ends and the last, else "
                                 "1c2f), as <target>-<ESTIMATOR>")
    estimators.add_argument("--alternatives", action="store_true",
                            help="fig10, fig_info_plane: also draw each other estimator with rows there, as "
                                 "<target>-<ESTIMATOR>")
    args = p.parse_args(argv)
    for target in args.targets:
        drawn = [args.estimator]
        if args.alternatives and target in ESTIMATOR_TARGETS:
            shown = RowPicker(args.recipe, args.arch, one_estimator=False)(load_mutual_info(args.results))
            drawn += other_estimators(shown)
        for estimator in drawn:
            for path in build(target, args.results, args.recipe, args.arch, estimator):
                print(f"wrote {path}")


if __name__ == "__main__":
    run(main)
