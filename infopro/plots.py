"""The paper's figures, drawn from result tables only, in one colour-blind-safe style: what every figure
shares, and the figures of training and memory (fig7, the training curves, fig_memory); the
per-layer figures of the analysis are `infopro.layer_plots`.

Every function takes DataFrames (read from CSVs under results/) and returns a matplotlib
Figure built without pyplot, so it works headless, in notebooks and in tests alike. Each
figure states in its footer the dataset, the training recipe, the number of seeds and the
estimator settings it shows; the paper's values, where drawn, are faint and labelled.
"""

import io
import textwrap
from pathlib import Path

import pandas as pd
from matplotlib import rcParams
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.textpath import TextPath
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from infopro.records import atomic_write
from infopro.selection import errors_by_method, figure_rows, measured_rows, memory_column, remeasured_times, with_method
from infopro.style import BENCH_FAMILIES, METHODS, styled


def new_figure(width: float, height: float, rows: int = 1, cols: int = 1):
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(rows, cols, squeeze=False)


def footer(figure: Figure, *lines: str) -> None:
    """Small grey provenance text under the axes, wrapped to the figure's width."""
    width = int(figure.get_figwidth() * 15)
    text = "\n".join(textwrap.fill(line, width) for line in lines if line)
    rows = text.count("\n") + 1
    height = (0.125 * rows + 0.08) / figure.get_figheight()  # 7-pt lines, plus a gap above them
    figure.get_layout_engine().set(rect=(0, height, 1, 1 - height))
    figure.text(0.01, 0.01, text, fontsize=7, color="#444444", ha="left", va="bottom")


def shared_legend(figure: Figure, axes, extra: list[tuple] = ()) -> None:
    """One legend above all panels: each label of the curves in `axes` (one Axes or an array
    of them) once, then the (handle, label) extras."""
    handles, labels = [], []
    for ax in getattr(axes, "flat", [axes]):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    for handle, label in extra:
        handles.append(handle)
        labels.append(label)
    figure.legend(handles, labels, loc="outside upper center", ncols=legend_columns(labels, figure.get_figwidth()),
                  frameon=False)


def legend_columns(labels: list[str], width_inches: float) -> int:
    """The most legend columns, at most one per 1.9 inches of the figure, whose entries fit its width,
    measured at the legend's font size: a column is as wide as its longest label, so a few long labels
    (the paper's curves, the ceiling) on one row would run past the figure's edges."""
    size = FontProperties(size=rcParams["legend.fontsize"]).get_size_in_points()
    widths = [TextPath((0, 0), label, size=size).get_extents().width for label in labels]
    handle = (rcParams["legend.handlelength"] + rcParams["legend.handletextpad"]) * size
    for columns in range(min(len(labels), int(width_inches / 1.9)), 1, -1):
        needed = sum(max(column) + handle for column in legend_layout(widths, columns))
        if needed + (columns - 1) * rcParams["legend.columnspacing"] * size <= 0.95 * width_inches * 72:
            return columns
    return 1


def legend_layout(entries: list, columns: int) -> list[list]:
    """The entries of each legend column, as matplotlib lays them out: column by column, the first
    columns one entry longer where they do not divide evenly."""
    rows, longer = divmod(len(entries), columns)
    sizes = [rows + 1] * longer + [rows] * (columns - longer)
    starts = [sum(sizes[:i]) for i in range(columns)]
    return [entries[start:start + size] for start, size in zip(starts, sizes)]


def seeds_text(df: pd.DataFrame, group: list[str], per: str = "point") -> str:
    """'n = 2 seeds per point', or 'n = 1-2 ...' where they differ: the seeds behind each `group` of rows,
    which is what the figure calls a `per`."""
    counts = df.groupby(group)["seed"].nunique()
    low, high = counts.min(), counts.max()
    return f"n = {low} seed{'s' if high > 1 else ''} per {per}" if low == high else f"n = {low}-{high} seeds per {per}"


def curve_seeds_text(df: pd.DataFrame, per: str = "point") -> str:
    """The seeds behind each point (method, K, layer) or each line (method, K) of a figure's curves, and
    what their shading means where there is some. Per point, because a curve's layer points may have been
    estimated on different seeds (a line then averages the seeds read at all of its points,
    `selection.seeds_at_every_point`)."""
    group = ["method", "K"] + (["layer"] if per == "point" else [])
    counts = df.groupby(group)["seed"].nunique()
    uneven = per == "point" and counts.groupby(level=["method", "K"]).nunique().max() > 1
    return (seeds_text(df, group, per) + ("; shading: lowest to highest seed" if counts.max() > 1 else "")
            + ("; a line: the seeds read at all its points" if uneven else ""))


def local_ks(df: pd.DataFrame) -> list[int]:
    """The K of each row or panel of a figure that shows E2E beside every method at one K:
    every local K in `df` (E2E alone gives one, K = 1)."""
    local = sorted(int(K) for K in df["K"].unique() if K > 1)
    return local or [1]


UNFINISHED = (Line2D([], [], marker="o", ms=5, mfc="white", mec="black", ls=""), "unfinished run stops here")


def epoch_curves(ax, rows: pd.DataFrame, value: str) -> None:
    """One line per method: mean of `value` at each epoch over the seeds that reached it, shaded
    from the lowest to the highest seed where there are several; an open marker where a
    configuration's unfinished run stops."""
    for method in (m for m in METHODS if m in set(rows["method"])):
        group = rows[rows["method"] == method]
        by_epoch = group.groupby("epoch")[value]
        means = by_epoch.mean()
        colour = METHODS[method][1]
        ax.plot(means.index, means.values, color=colour, lw=1.2, label=METHODS[method][0])
        if group["seed"].nunique() > 1:
            ax.fill_between(means.index, by_epoch.min(), by_epoch.max(), color=colour, alpha=0.15, lw=0)
        stops = sorted(set(group[~group["finished"]].groupby("run_id")["epoch"].max()))
        ax.scatter(stops, means.loc[stops], s=26, color="white", edgecolor=colour, linewidth=1.2, zorder=3)


def unfinished_text(curves: pd.DataFrame) -> str:
    """Each unfinished run as "InfoPro (Contrast) K = 8 seed 0: epoch 91 of 160", for a footer."""
    last = curves[~curves["finished"]].groupby(["method", "K", "seed", "epochs"])["epoch"].max()
    return "; ".join(f"{METHODS[method][0]}{'' if K == 1 else f' K = {K}'} seed {seed}: epoch {epoch} of {epochs}"
                     for (method, K, seed, epochs), epoch in last.items())


@styled
def fig_training_curves(curves: pd.DataFrame) -> Figure:
    """Test and train error per epoch, one column per K with E2E beside every method at that K,
    unfinished runs included (infopro.runs.training_curves). Table 2 and fig7 show final epochs
    only; the curves show whether a configuration had converged, whether greedy SL's modules
    underfit (its train error stays high where InfoPro's falls) and where an unfinished run
    stands against the finished ones at the same epoch. Log-scaled errors, so the first epochs'
    80 % and the last epochs' few per cent read on one axis."""
    curves, recipe = figure_rows(curves)
    column_ks = local_ks(curves)
    figure, axes = new_figure(0.6 + 3.3 * len(column_ks), 6.9, 2, len(column_ks))
    for column, K in enumerate(column_ks):
        shown = curves[(curves["K"] == K) | (curves["method"] == "e2e")]
        for ax, value, name in ((axes[0, column], "test_error", "test error"),
                                (axes[1, column], "train_error", "train error")):
            epoch_curves(ax, shown, value)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set(title=f"{name}, " + ("E2E" if K == 1 else f"K = {K}"), xlabel="epoch", ylabel=f"{name} (%)")
    unfinished = curves[~curves["finished"]]
    shared_legend(figure, axes, [UNFINISHED] if not unfinished.empty else [])
    first = curves.iloc[0]
    footer(figure, f"{first['arch']}, {recipe}; {curve_seeds_text(curves, 'line')}; each line is the "
           "mean over the seeds that reached the epoch. Train error: the network's head on the epoch's augmented "
           "batches as they were trained; test error: the whole test split after the epoch (metrics.csv).",
           f"Unfinished: {unfinished_text(curves)}." if not unfinished.empty else "")
    return figure


def error_by_k(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean, std and n of the final test error per (method, K); E2E is K = 1 of every method."""
    stats = runs.groupby(["method", "K"])["final_test_error"].agg(["mean", "std", "count"]).reset_index()
    return stats.rename(columns={"count": "n"})


@styled
def fig7_error_vs_k(runs: pd.DataFrame, reference: pd.DataFrame) -> Figure:
    """Final test error vs K per method, mean ± std over seeds; the paper's Table 2 faint behind."""
    runs, recipe = figure_rows(runs)
    stats = error_by_k(runs)
    e2e = stats[stats["method"] == "e2e"]
    reference = with_method(reference[(reference["arch"] == runs["arch"].iloc[0])
                                      & (reference["dataset"] == "cifar10")])
    figure, axes = new_figure(5.2, 4.2)
    ax = axes[0, 0]
    for method, (label, colour, marker, _) in METHODS.items():
        if method == "e2e":
            continue
        ours = pd.concat([e2e, stats[stats["method"] == method]]).sort_values("K")
        if len(ours) > len(e2e):
            ax.errorbar(ours["K"], ours["mean"], yerr=ours["std"].fillna(0), color=colour, marker=marker,
                        ms=5, lw=1.5, capsize=3, label=label)
        paper = pd.concat([reference[reference["method"] == "e2e"],
                           reference[reference["method"] == method]]).sort_values("K")
        if len(ours) > len(e2e) and len(paper) > 1:
            ax.plot(paper["K"], paper["error_mean"], color=colour, marker=marker, ms=4, lw=0.8, ls="--",
                    alpha=0.35, mfc="none")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8, 16], ["1\n(E2E)", "2", "4", "8", "16"])
    ax.set(xlabel="K (number of local modules)", ylabel="test error (%), final epoch")
    ax.set_ylim(bottom=0)
    shared_legend(figure, ax, [(Line2D([], [], color="grey", ls="--", lw=0.8, alpha=0.5),
                                "paper Table 2 (cifar10, mean of 5 seeds)")])
    first = runs.iloc[0]
    footer(figure, f"{first['arch']}, {recipe}; {seeds_text(runs, ['method', 'K'])}; "
           f"error bars: std over seeds.")
    return figure


def save_figure(figure: Figure, stem) -> list[Path]:
    """Write `stem`.png (150 dpi) and `stem`.pdf; the PDF carries no creation date, so it is
    byte-stable when rebuilt from the same results."""
    paths = []
    for suffix, options in ((".png", {"dpi": 150}), (".pdf", {"metadata": {"CreationDate": None}})):
        buffer = io.BytesIO()
        figure.savefig(buffer, format=suffix[1:], **options)
        path = Path(f"{stem}{suffix}")
        atomic_write(path, buffer.getvalue())
        paths.append(path)
    return paths


def method_point(ax, x: float, y: float, result: pd.Series, top: float | None = None) -> None:
    """One benchmarked method as a point in its family's style, labelled with its K; a `y` above `top`
    (`off_scale_top`) is drawn at the panel's top edge and labelled with its value."""
    label, colour, marker = BENCH_FAMILIES[result["family"]]
    text = "" if result["K"] == 1 else f"K={result['K']}"
    if top is not None and y > top:
        text = ", ".join(part for part in (text, f"{y:+.0f}% (off scale)") if part)
        y = 0.95 * top
    ax.scatter(x, y, color=colour, marker=marker, s=36, label=label)
    ax.annotate(text, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")


OFF_SCALE = 8  # a step time overhead this many times every other's is drawn at the panel's edge


def off_scale_top(overheads) -> float | None:
    """The top of a time panel's y-axis that leaves out one overhead `OFF_SCALE` times above every other
    (None: all fit). Why: offloading's step takes about ten times E2E's on a GPU, and on one scale with
    it the other methods' overheads, a few to 70%, lie on one line."""
    highest, second = sorted(overheads, reverse=True)[:2] if len(overheads) > 1 else (0, 0)
    return 1.25 * second if second > 0 and highest > OFF_SCALE * second else None


def no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#666666")


@styled
def fig_memory(bench: pd.DataFrame, runs: pd.DataFrame, work: dict[str, pd.DataFrame] | None = None) -> Figure:
    """Per benchmarked architecture: memory (% of E2E) vs test error, time vs memory, and time vs
    operators where the work of a step was counted (`work`: architecture -> counts at the step
    table's batch): whether a method's extra time follows its extra operators rather than its FLOPs."""
    work = work or {}
    archs = list(dict.fromkeys(bench["arch"]))
    figure, axes = new_figure(12.6, 0.8 + 3.2 * len(archs), len(archs), 3)
    notes = []
    for row, arch in enumerate(archs):
        notes += memory_row(axes[row], arch, measured_rows(bench[bench["arch"] == arch]), runs,
                            work.get(arch, pd.DataFrame()))
    if work:
        notes.append("dotted: time overhead = operator overhead")
    shared_legend(figure, axes)
    footer(figure, "; ".join(notes) + ".")
    return figure


def memory_row(axes, arch: str, rows: pd.DataFrame, runs: pd.DataFrame, counted: pd.DataFrame) -> list[str]:
    """fig_memory's three panels of one architecture (`rows`: its step table; `counted`: its work counts,
    empty where none), and the footer's notes on them."""
    column, described = memory_column(rows)
    errors, recipe = errors_by_method(runs, arch, rows["method"])
    operators = dict(zip(counted["method"], counted["step_operators_vs_e2e"])) \
        if "step_operators_vs_e2e" in counted else {}
    top = off_scale_top(list(100 * (rows["step_seconds_vs_e2e"] - 1)))
    for _, result in rows.iterrows():
        memory, time = 100 * result[f"{column}_vs_e2e"], 100 * (result["step_seconds_vs_e2e"] - 1)
        if result["method"] in errors:
            method_point(axes[0], memory, errors[result["method"]][0], result)
        method_point(axes[1], memory, time, result, top)
        if pd.notna(operators.get(result["method"])):
            method_point(axes[2], 100 * (operators[result["method"]] - 1), time, result)
    first = rows.iloc[0]
    where = f"{arch}, batch {first['batch_size']}"
    axes[0].set(title=f"{where}: error vs memory", xlabel="memory (% of E2E)", ylabel="test error (%)")
    axes[1].set(title=f"{where}: time vs memory", xlabel="memory (% of E2E)", ylabel="step time overhead vs E2E (%)")
    axes[2].set(title=f"{where}: time vs operators", xlabel="operator overhead vs E2E (%)",
                ylabel="step time overhead vs E2E (%)")
    if top is not None:
        axes[1].set_ylim(top=top)
    if not errors:
        no_data(axes[0], f"no training runs of {arch} yet")
    notes = []
    if operators:
        axes[2].axline((0, 0), slope=1, color="#999999", lw=0.8, ls=":")
        notes.append(f"{arch} operators: ATen operators per step, counted on {counted['device'].iloc[0]}")
    else:
        no_data(axes[2], f"work not counted at batch {first['batch_size']}")
    notes.append(f"{arch}: {first['precision']} on {first['device_name']}; memory = {described}")
    if remeasured := remeasured_times(rows):
        notes.append(f"{arch}: {remeasured}")
    if errors:
        notes.append(f"{arch} test errors: final epoch of our runs ({recipe})")
    if first["device"] == "cpu":
        notes.append(f"{arch}: times measured on a shared CPU: indicative only")
    return notes
