"""The per-layer figures of the paper's analysis: linear probes (fig8), I(h,x) and I(h,y) (fig10), the
information plane, and the schedule check, one curve per K with the ends of the local modules marked.

Drawn like every figure (`infopro.plots`): from result tables only, without pyplot, each with a
footer stating the dataset, recipe, seeds and the estimator's settings.
"""

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from infopro.analysis import ceilings_beside
from infopro.errors import InfoProError
from infopro.plots import curve_seeds_text, footer, local_ks, new_figure, seeds_text, shared_legend
from infopro.selection import ANALYSIS_FIGURE_ARCH, figure_rows, seeds_at_every_point, with_method
from infopro.splits import num_layer_points
from infopro.style import K_COLOURS, METHODS, PURPLE, local_methods, styled

LAYER_AXIS = "layer point (1 = stem, then one per residual block)"


def layer_axis(ax, ylabel: str) -> None:
    ax.set_xlabel(LAYER_AXIS)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


MODULE_END = (Line2D([], [], marker="o", ms=6, mfc="white", mec="black", ls=""), "end of a local module")


def layer_curves(ax, df: pd.DataFrame, value: str, ends: dict[int, list[int]]) -> None:
    """One line per K: mean of `value` over the seeds read at each of its layer points
    (`selection.seeds_at_every_point`), shaded from the lowest to the highest seed read there where
    there are several (so a gap between curves can be read against the seed spread); module ends as
    large markers, the network's last layer point among them (a curve that stops short of it,
    estimated so far only in part, ends without one)."""
    for K, group in sorted(df.groupby("K"), key=lambda item: item[0]):
        by_layer = group.groupby("layer")[value]
        means = seeds_at_every_point(group, value).groupby("layer")[value].mean()
        colour = K_COLOURS.get(K, PURPLE)
        label = "K = 1 (E2E)" if K == 1 else f"K = {K}"
        ax.plot(means.index, means.values, color=colour, lw=1.4, marker="o", ms=2.5, label=label)
        if group["seed"].nunique() > 1:
            ax.fill_between(means.index, by_layer.min()[means.index], by_layer.max()[means.index], color=colour,
                            alpha=0.15, lw=0)
        last = num_layer_points(group["arch"].iloc[0])
        at_ends = [layer for layer in means.index if layer in ends.get(K, []) or layer == last]
        ax.scatter(at_ends, means.loc[at_ends], s=28, color=colour, edgecolor="black", linewidth=0.8, zorder=3)


def layer_table(df: pd.DataFrame, values: str | list[str]) -> pd.DataFrame:
    """The numbers behind a per-layer figure, as its notebook prints them: `values` per layer
    point, mean over the seeds the figure averages (`selection.seeds_at_every_point`), one column per
    (network, recipe, method, K, split, and estimator where rows have one). Networks, recipes, splits
    and estimators stay apart (a 12-epoch fixture averaged with a 160-epoch run means nothing), and
    E2E and greedy SL, whose task_loss is blank, are columns too."""
    columns = ["arch", "recipe", "method", "K", "split"] + (["estimator"] if "estimator" in df else [])
    shown = pd.concat(seeds_at_every_point(rows, values) for _, rows in with_method(df).groupby(columns, dropna=False))
    return shown.pivot_table(index="layer", columns=columns, values=values, aggfunc="mean")


def module_end_table(df: pd.DataFrame) -> dict[int, list[int]]:
    """K -> layer points that end a local module, from the analysis rows' module_end flags."""
    return {K: sorted(group.loc[group["module_end"].astype(bool), "layer"].unique())
            for K, group in df.groupby("K")}


def reference_curves(ax, reference: pd.DataFrame, quantity: str, Ks) -> bool:
    """The paper's read-off values at the K in `Ks` (the panel's curves) as faint thin lines; True if any
    were drawn. A K the panel lacks gets none: a dashed line would have no curve, and no legend entry."""
    rows = reference[(reference["quantity"] == quantity) & reference["K"].isin(list(Ks))]
    for K, group in rows.groupby("K"):
        ax.plot(group["layer"], group["value"], color=K_COLOURS.get(K, PURPLE), lw=0.8, alpha=0.35, ls="--")
    return not rows.empty


def panel_rows(df: pd.DataFrame, method: str) -> pd.DataFrame:
    """Rows of one method plus the E2E rows, which every panel shows as K = 1."""
    return df[df["method"].isin([method, "e2e"])]


@styled
def fig8_linear_probes(probes: pd.DataFrame, reference: pd.DataFrame) -> Figure:
    """Linear-probe test error vs layer point, one curve per K: greedy SL, and DGL and InfoPro beside it."""
    probes, recipe = figure_rows(probes)
    panels = [m for m in local_methods() if m in set(probes["method"])]
    panels = panels or ["e2e"]
    figure, axes = new_figure(4.0 * len(panels), 3.9, 1, len(panels))
    ends = module_end_table(probes)
    paper = False
    for ax, method in zip(axes[0], panels):
        layer_curves(ax, panel_rows(probes, method), "test_error", ends)
        if method == "greedy" and probes["arch"].iloc[0] == ANALYSIS_FIGURE_ARCH:
            paper = reference_curves(ax, reference, "linear_probe_test_error", set(panel_rows(probes, method)["K"]))
        ax.set_title(METHODS[method][0])
        layer_axis(ax, "linear-probe test error (%)")
        ax.set_ylim(bottom=0)
    extra = [MODULE_END]
    if paper:
        extra.append((Line2D([], [], color="grey", alpha=0.5, ls="--", lw=0.8),
                      "paper, greedy SL (read off)"))
    shared_legend(figure, axes[0, 0], extra)
    first = probes.iloc[0]
    footer(figure, f"{first['arch']}, {recipe}; {curve_seeds_text(probes)}.", probe_text(first))
    return figure


# The two estimators of I(h,x) and I(h,y) (infopro/analysis.py), each drawn in its own units:
# estimator -> ((I(h,x) column, axis label), (I(h,y) column, axis label)).
MI_AXES = {
    "remainder": (("ixx_paper", "I(h,x): 1 − decoder's BCE per value"),
                  ("ixy_paper", "I(h,y): remainder's test accuracy")),
    "1c2f": (("ixx_normalised", "Î(h,x) / reducible H(x)"), ("ixy_normalised", "Î(h,y) / H(y), 1c2f head")),
}
PAPER_MI = {"ixx_paper": "ixx_paper_units", "ixy_paper": "ixy_paper_units"}  # results/reference/analysis_figure.csv
PAPER_DASHED = (Line2D([], [], color="grey", alpha=0.5, ls="--", lw=0.8), "paper, greedy SL and E2E (read off)")
CEILING = (Line2D([], [], color="grey", ls=":", lw=1.2), "ceiling: the architecture trained on x, same budget")


def estimator_of(mi: pd.DataFrame) -> str:
    """The one estimator whose rows a figure shows (the `estimator` column; rows without one are 1c2f's)."""
    estimators = set(mi["estimator"].fillna("1c2f")) if "estimator" in mi else {"1c2f"}
    if len(estimators) != 1:
        raise InfoProError(f"these rows mix the estimators {', '.join(sorted(estimators))}; draw one at a time")
    return estimators.pop()


def ceiling_accuracy(mi: pd.DataFrame, ceilings: pd.DataFrame | None) -> float | None:
    """The mean ceiling measured against a network of the remainder rows' `mi` architecture and recipe with
    their budget (None if none was)."""
    if ceilings is None or ceilings.empty:
        return None
    same = ceilings_beside(ceilings, mi.iloc[0])
    return None if same.empty else float(same["ixy_paper"].mean())


@styled
def fig10_mutual_information(mi: pd.DataFrame, reference: pd.DataFrame | None = None,
                             ceilings: pd.DataFrame | None = None) -> Figure:
    """I(h,x) and I(h,y) vs layer point, one curve per K; a row per method. Remainder rows are drawn in
    the paper's units, with its read-off greedy SL and E2E values dashed in the greedy row and the
    ceiling of the estimator's budget dotted on every I(h,y) panel."""
    estimator = estimator_of(mi)
    mi, recipe = figure_rows(mi)
    methods = [m for m in local_methods() if m in set(mi["method"])]
    methods = methods or ["e2e"]
    figure, axes = new_figure(8.0, 0.6 + 2.9 * len(methods), len(methods), 2)
    ends = module_end_table(mi)
    ceiling = ceiling_accuracy(mi, ceilings) if estimator == "remainder" else None
    paper = False
    for row, method in enumerate(methods):
        rows = panel_rows(mi, method)
        for ax, (value, label) in zip(axes[row], MI_AXES[estimator]):
            layer_curves(ax, rows, value, ends)
            if value in PAPER_MI and reference is not None and method in ("greedy", "e2e") \
                    and mi["arch"].iloc[0] == ANALYSIS_FIGURE_ARCH:
                paper = reference_curves(ax, reference, PAPER_MI[value], set(rows["K"])) or paper
            if value == "ixy_paper" and ceiling is not None:
                ax.axhline(ceiling, color="grey", ls=":", lw=1.2)
            ax.set_title(f"{METHODS[method][0]}: {label.split(':')[0].split(' /')[0]}")
            layer_axis(ax, label)
    extra = [MODULE_END] + [PAPER_DASHED] * paper + [CEILING] * (ceiling is not None)
    shared_legend(figure, axes[0, 0], extra)
    first = mi.iloc[0]
    footer(figure, f"{first['arch']}, {recipe}; {curve_seeds_text(mi)}.{partial_curves_text(mi)}",
           estimator_text(first, estimator))
    return figure


def partial_curves_text(mi: pd.DataFrame) -> str:
    """A footer sentence where some curve (method, K: its seeds together) joins fewer than all its layer
    points: the remainder estimator reaches the points between module ends last (experiments/stages.py)."""
    curves = with_method(mi).groupby(["method", "K"])
    short = any(rows["layer"].nunique() < num_layer_points(rows["arch"].iloc[0]) for _, rows in curves)
    return (" Curves with fewer markers join only the layer points estimated so far (layer 1, the module ends "
            "and the last come first).") if short else ""


def estimator_text(row: pd.Series, estimator: str) -> str:
    """The footer line of the I(h,x), I(h,y) estimator `estimator`, from one of its rows."""
    return remainder_text(row) if estimator == "remainder" else mutual_info_text(row)


def remainder_text(row: pd.Series) -> str:
    """The remainder estimator's settings, for a footer, from one row of the mutual-information CSV."""
    return (f"Remainder estimator (infopro/remainder.py): per layer point, a fresh copy of the layers after it and the "
            f"head trained on the frozen h, InfoPro's decoder beside it; SGD Nesterov, lr {row['rem_lr']:g}, batch "
            f"{row['rem_batch_size']:g}, {row['rem_epochs']:g} epochs, {row['rem_precision']}; "
            f"{row['mi_train_images']:,} augmented train / {row['mi_test_images']:,} test images.")


def probe_text(row: pd.Series) -> str:
    """The linear probe's settings, for a footer, from one row of the probe CSV."""
    return (f"Probe: {row['pool']} pooling, multinomial logistic regression (L2 {row['l2']:g}, L-BFGS) fitted on "
            f"{row['probe_train_images']:,} train images of the frozen network; error on "
            f"{row['probe_test_images']:,} test images.")


def mutual_info_text(row: pd.Series) -> str:
    """The 1c2f estimators' settings, for a footer, from one row of the mutual-information CSV."""
    return (f"Usable information to a small head (infopro/mi.py): I(h,x) from a decoder trained with pixel BCE, "
            f"as a fraction of the entropy a perfect reconstruction removes; I(h,y) from a 1c2f classifier, "
            f"as a fraction of H(y) = ln 10. Adam lr {row['est_lr']:g}, {row['est_epochs']:g} epochs, "
            f"{row['mi_train_images']:,} train / {row['mi_test_images']:,} test images.")


def paired_schedules(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of the (method, K, seed) analysed after more than one schedule length, so that a
    difference between lengths is never a difference between seeds."""
    lengths = df.groupby(["method", "K", "seed"])["epochs"].transform("nunique")
    return df[lengths > 1]


def schedule_seeds_text(df: pd.DataFrame) -> str:
    """Which seeds each configuration shows, e.g. "E2E: seed 1; K = 4: seed 1; K = 8: seed 0"
    (rows may show different seeds: only seeds analysed after both lengths are drawn)."""
    parts = []
    for K, group in df.groupby("K"):
        seeds = sorted(int(seed) for seed in group["seed"].unique())
        name = "E2E" if K == 1 else f"K = {K}"
        parts.append(f"{name}: seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}")
    return "; ".join(parts)


def schedule_curves(ax, df: pd.DataFrame, value: str) -> None:
    """One line per method and schedule length (mean over seeds): dashed after the fewest
    epochs, solid after the others; module ends as large markers."""
    shortest = df["epochs"].min()
    for (method, epochs), group in df.groupby(["method", "epochs"]):
        means = group.groupby("layer")[value].mean()
        colour, style = METHODS[method][1], "--" if epochs == shortest else "-"
        ax.plot(means.index, means.values, color=colour, ls=style, lw=1.4, marker="o", ms=2.5,
                alpha=0.6 if epochs == shortest else 1.0)
        ends = sorted(set(group.loc[group["module_end"].astype(bool), "layer"]) | {means.index.max()})
        ax.scatter(ends, means.loc[ends], s=28, color=colour, edgecolor="black", linewidth=0.8, zorder=3,
                   alpha=0.6 if epochs == shortest else 1.0)


@styled
def fig_schedule(probes: pd.DataFrame, mi: pd.DataFrame) -> Figure:
    """The schedule check's analysis: linear-probe error, Î(h,x) and Î(h,y) per layer point of the
    same configurations and seeds after a short and a longer schedule, so one sees which layers
    the extra epochs change and whether the methods' order per layer turns with their test errors.
    One row per K, each with E2E as its reference. Takes the rows of `paired_schedules` (with a
    `method` column)."""
    row_ks = local_ks(probes)
    figure, axes = new_figure(12.0, 1.0 + 3.1 * len(row_ks), len(row_ks), 3)
    panels = ((probes, "test_error", "linear separability", "linear-probe test error (%)"),
              (mi, "ixx_normalised", "I(h,x)", "Î(h,x) / reducible H(x)"),
              (mi, "ixy_normalised", "I(h,y)", "Î(h,y) / H(y)"))
    for row, K in zip(axes, row_ks):
        for ax, (df, value, title, label) in zip(row, panels):
            schedule_curves(ax, df[(df["K"] == K) | (df["method"] == "e2e")], value)
            ax.set_title(title if K == 1 else f"{title}, K = {K}")
            layer_axis(ax, label)
        row[0].set_ylim(bottom=0)
    methods = [method for method in METHODS if method in set(probes["method"])]
    lengths = sorted(probes["epochs"].unique())
    extra = [(Line2D([], [], color=METHODS[method][1], lw=1.4), METHODS[method][0]) for method in methods]
    extra += [(Line2D([], [], color="grey", ls="--" if epochs == lengths[0] else "-", lw=1.4), f"{epochs} epochs")
              for epochs in lengths]
    shared_legend(figure, axes[0, 0], extra + [MODULE_END])
    short = probes[probes["epochs"] == lengths[0]].iloc[0]
    averaged = probes.groupby(["method", "K", "epochs"])["seed"].nunique().max() > 1
    footer(figure, f"{short['arch']}, {short['recipe']} (dashed), and the same configurations and seeds at "
           f"{' and '.join(str(e) for e in lengths[1:])} epochs (solid); "
           f"{'mean over seeds' if averaged else 'one network per line'} ({schedule_seeds_text(probes)}).",
           probe_text(short), mutual_info_text(mi.iloc[0]))
    return figure


STEM = (Line2D([], [], marker="o", ms=5, mfc="white", mec="grey", ls=""), "layer point 1 (stem)")


def plane_path(ax, rows: pd.DataFrame, method: str, columns=("ixx_normalised", "ixy_normalised")) -> None:
    """One configuration's path through the information plane, layer point by layer point (mean
    over the seeds read at each of its points): an open marker at the stem, large markers at module
    ends, an arrowhead at the last layer."""
    means = seeds_at_every_point(rows, list(columns)).groupby("layer")[list(columns)].mean()
    x, y = means[columns[0]], means[columns[1]]
    label, colour, marker, _ = METHODS[method]
    ax.plot(x, y, color=colour, lw=1.3, marker=marker, ms=2.5, label=label)
    ax.scatter(x.iloc[:1], y.iloc[:1], s=30, color="white", edgecolor=colour, linewidth=1.2, zorder=3)
    ends = sorted(set(rows.loc[rows["module_end"].astype(bool), "layer"]) & set(means.index))
    ax.scatter(x.loc[ends], y.loc[ends], s=28, color=colour, edgecolor="black", linewidth=0.8, zorder=3)
    if len(means) > 1:
        ax.annotate("", xy=(x.iloc[-1], y.iloc[-1]), xytext=(x.iloc[-2], y.iloc[-2]),
                    arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 1.3, "mutation_scale": 12})


@styled
def fig_information_plane(mi: pd.DataFrame) -> Figure:
    """Î(h,x) against Î(h,y), layer point by layer point: one panel per K, every method at that K
    beside E2E, on shared axes. fig10 draws the same rows per method; here the methods meet in
    one panel, so one sees where greedy SL trades the input for the label early and InfoPro
    keeps both."""
    estimator = estimator_of(mi)
    (x, xlabel), (y, ylabel) = MI_AXES[estimator]
    mi, recipe = figure_rows(mi)
    panel_ks = local_ks(mi)
    cols = min(2, len(panel_ks))
    grid_rows = -(-len(panel_ks) // cols)
    figure, axes = new_figure(4.2 * cols, 0.9 + 3.7 * grid_rows, grid_rows, cols)
    limits = [(mi[value].min() - 0.03, mi[value].max() + 0.03) for value in (x, y)]
    for ax, K in zip(axes.flat, panel_ks):
        shown = mi[(mi["K"] == K) | (mi["method"] == "e2e")]
        for method in (m for m in METHODS if m in set(shown["method"])):
            plane_path(ax, shown[shown["method"] == method], method, (x, y))
        ax.set(xlim=limits[0], ylim=limits[1], title="E2E" if K == 1 else f"K = {K}", xlabel=xlabel, ylabel=ylabel)
    for ax in axes.flat[len(panel_ks):]:
        ax.set_visible(False)
    shared_legend(figure, axes, [STEM, MODULE_END])
    first = mi.iloc[0]
    footer(figure, f"{first['arch']}, {recipe}; {seeds_text(mi, ['method', 'K', 'layer'])}; each path is the mean "
           f"over the seeds read at each of its layer points, from the stem to the last layer (arrowhead)."
           f"{partial_curves_text(mi)}",
           estimator_text(first, estimator))
    return figure


