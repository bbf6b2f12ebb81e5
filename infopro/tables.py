"""The paper's tables from result files: built as DataFrames, written as CSV, Markdown and LaTeX.

Table 2 puts our final-epoch test error (mean ± std over n seeds, n shown) beside the
paper's value for each method and K, with the difference. Numbers come only from run
summaries under results/ and from results/reference/ (the paper's values, with a source).
"""

import math
from pathlib import Path

import pandas as pd

from infopro.errors import InfoProError
from infopro.paired import ordered_comparisons, paired_comparisons
from infopro.records import atomic_write
from infopro.selection import (PAPER_RANKING, TABLE3_METHODS, commits, errors_by_method, figure_rows, measured_rows,
                               memory_column, method_label, remeasured_times, training_by_recipe, with_method)
from infopro.style import METHODS


def mean_std(mean: float, std: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    spread = "" if std is None or (isinstance(std, float) and math.isnan(std)) else f" ± {std:.2f}"
    return f"{mean:.2f}{spread}"


def table2(runs: pd.DataFrame, reference: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows per (method, K): ours (mean ± std, n) for the recipe the figures show (the paper's by
    default, `figure_rows`) beside the paper's, with the difference; returns (table, caption)."""
    runs = figure_rows(runs)[0]
    arch, names = runs["arch"].iloc[0], recipe_names(runs)
    paper = with_method(reference[(reference["arch"] == arch) & (reference["dataset"] == "cifar10")])
    merged = pd.concat([runs[["method", "K"]], paper[["method", "K"]]]).drop_duplicates()  # the paper's rows stay
    for recipe in names:
        ours = runs[runs["recipe"] == recipe].groupby(["method", "K"])["final_test_error"].agg(["mean", "std", "count"])
        merged = merged.merge(ours.add_suffix(f" {recipe}").reset_index(), on=["method", "K"], how="left")
    merged = in_paper_order(merged.merge(paper[["method", "K", "error_mean", "error_std"]], on=["method", "K"],
                                         how="left"))
    table = pd.DataFrame({"method": [METHODS[m][0] for m in merged["method"]], "K": merged["K"]})
    for recipe, name in names.items():
        table[f"ours, {name}: test error (%)"] = [mean_std(m, s) for m, s in
                                                  zip(merged[f"mean {recipe}"], merged[f"std {recipe}"])]
        table[f"n, {name}"] = merged[f"count {recipe}"].fillna(0).astype(int)
    table["paper: test error (%)"] = [mean_std(m, s) for m, s in zip(merged["error_mean"], merged["error_std"])]
    for recipe, name in names.items():
        table[f"{name} − paper"] = [f"{a - b:+.2f}" if not (math.isnan(a) or math.isnan(b)) else "–"
                                    for a, b in zip(merged[f"mean {recipe}"], merged["error_mean"].astype(float))]
    recipes = "; ".join(f"{name}: {recipe}" for recipe, name in names.items())
    caption = (f"Table 2, {arch}: final-epoch test error, ours (mean ± std over n seeds; {recipes}) "
               f"beside the paper's (cifar10, 160 epochs, batch 1024, mean ± std over 5 seeds).")
    return table.reset_index(drop=True), caption


def recipe_names(runs: pd.DataFrame) -> dict:
    """recipe -> its short name in Table 2's headers ("160 epochs" while the epochs tell the
    recipes apart, else the whole recipe), most-trained recipe first."""
    training = training_by_recipe(runs).sort_values(ascending=False)
    epochs = runs.groupby("recipe")["epochs"].first()
    distinct = epochs.nunique() == len(epochs)
    return {recipe: f"{epochs[recipe]} epochs" if distinct else recipe for recipe in training.index}


def paper_order(column: pd.Series) -> pd.Series:
    """Sort key putting a `method` column in the order of METHODS (E2E, greedy SL, DGL, InfoPro
    (Contrast), InfoPro (Softmax)); any other column sorts as it is."""
    return column.map({method: i for i, method in enumerate(METHODS)}) if column.name == "method" else column


def in_paper_order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted as the paper's tables: method in paper order, K within."""
    return df.sort_values(["method", "K"], key=paper_order)


def schedule_check(pairs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Final errors of the same configurations and seeds at two schedule lengths, side by side.

    `pairs` is `runs.schedule_pairs`: one row per seed. Does the fixture's ordering of the methods
    hold when they train longer? Each cell is the mean ± std over the n seeds run at both lengths.
    """
    lengths = pairs[["epochs_short", "epochs_long"]].drop_duplicates()
    if len(lengths) != 1:
        raise InfoProError(f"the schedule check pairs several schedule lengths "
                           f"({', '.join(f'{a} and {b}' for a, b in lengths.itertuples(index=False))}); "
                           f"it compares one pair")
    short, long = lengths.iloc[0]
    columns = {f"test error (%), {short} epochs": "test_error_short", f"test error (%), {long} epochs": "test_error_long",
               f"train error (%), {short} epochs": "train_error_short", f"train error (%), {long} epochs": "train_error_long"}
    rows = [{"method": METHODS[method][0], "K": K, "n": len(group)}
            | {name: mean_std(group[column].mean(), group[column].std()) for name, column in columns.items()}
            for (method, K), group in in_paper_order(with_method(pairs)).groupby(["method", "K"], sort=False)]
    first = pairs.iloc[0]
    caption = (f"Schedule check, {first['arch']}: final-epoch errors of the same configurations and seeds trained for "
               f"{short} and {long} epochs ({first['dataset']}, {first['train_images']:,} train / "
               f"{first['test_images']:,} test images, batch {first['batch_size']}; mean ± std over the n seeds "
               f"run at both lengths).")
    return pd.DataFrame(rows), caption


def paired(predictions: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """InfoPro against greedy SL image by image, one row per configuration and seed (infopro/paired.py).

    Each InfoPro run is compared with the greedy SL run of the same K, recipe and seed on the
    test images neither was trained on or reported on; the last column is the same lead on
    the images of their recorded errors, where it was first seen.
    """
    pairs = paired_comparisons(predictions[predictions["regime"].isin(["greedy", "infopro"])])
    if pairs.empty:
        raise InfoProError("no InfoPro run has a greedy SL run of the same K, recipe and seed among the scored runs")
    return paired_table(pairs, predictions, ("greedy SL", "InfoPro"),
                        "InfoPro against greedy SL of the same K, recipe and seed", "greedy SL's error − InfoPro's")


def e2e_gap(predictions: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Greedy SL, DGL and InfoPro against E2E image by image: how far behind end-to-end training each
    locally supervised network is (the paper's claim is that InfoPro's gap is small), checked
    on the test images neither network was trained on or reported on, as `paired` does."""
    pairs = paired_comparisons(predictions, reference="e2e")
    if pairs.empty:
        raise InfoProError("no locally supervised run has an E2E run of the same recipe and seed among the scored runs")
    return paired_table(pairs, predictions, ("E2E", "method"),
                        f"{regime_names(pairs['regime'])} against E2E of the same recipe and seed",
                        "E2E's error − the method's")


def ranking(predictions: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The steps of the paper's ranking (InfoPro (Contrast) < InfoPro (Softmax) < DGL < greedy SL)
    image by image: each run beside the run ranked next after it with the same K, recipe and seed,
    as `paired` does. Table 2's means can order two methods by a difference that the test
    images do not resolve; here each step has its paired standard error and McNemar's p."""
    pairs = ordered_comparisons(with_method(predictions), PAPER_RANKING)
    if pairs.empty:
        raise InfoProError("no two methods of the paper's ranking have runs of the same K, recipe and seed among "
                           "the scored runs")
    steps = pairs.assign(rank=pairs["method"].map(PAPER_RANKING.index)).sort_values(["epochs", "K", "seed", "rank"])
    table, caption = paired_table(steps, predictions, ("next", "method"),
                                  "each method against the one ranked next after it by the paper (InfoPro (Contrast) "
                                  "< InfoPro (Softmax) < DGL < greedy SL; where one has no run, its neighbours meet) "
                                  "of the same K, recipe and seed", "the next method's error − this method's, "
                                  "positive where the paper's step holds", in_order=True)
    table.insert(1, "next", [METHODS[method][0] for method in steps["reference_method"]])
    return table, caption


def regime_names(regimes: pd.Series) -> str:
    """'greedy SL and InfoPro', 'greedy SL, DGL and InfoPro': the locally supervised regimes present."""
    names = [name for regime, name in (("greedy", "greedy SL"), ("dgl", "DGL"), ("infopro", "InfoPro"))
             if regime in set(regimes)]
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


def paired_table(pairs: pd.DataFrame, predictions: pd.DataFrame, names: tuple[str, str], comparison: str,
                 lead: str, in_order: bool = False) -> tuple[pd.DataFrame, str]:
    """The rows of `paired_comparisons` as a table, the error columns headed by `names` (the
    reference's, the other network's), with a caption naming the images and what `lead` is
    (the reference's error − the other's: negative where the other network errs more). Rows run
    by method within K, or as `pairs` has them when `in_order`."""
    pairs = with_method(pairs)
    if not in_order:
        pairs = pairs.sort_values(["epochs", "K", "method", "seed"], key=paper_order, kind="stable")
    table = pd.DataFrame({
        "method": [METHODS[m][0] for m in pairs["method"]], "K": pairs["K"], "epochs": pairs["epochs"],
        "seed": pairs["seed"], "images": pairs["images"],
        f"{names[0]}: error (%)": pairs["error_a"].map("{:.2f}".format),
        f"{names[1]}: error (%)": pairs["error_b"].map("{:.2f}".format),
        "lead ± paired SE (points)": [f"{a:+.2f} ± {b:.2f}" for a, b in zip(pairs["lead"], pairs["paired_se"])],
        "McNemar p": pairs["mcnemar_p"].map(p_value),
        "lead on the recorded images": (pairs["reference_recorded_test_error"] - pairs["recorded_test_error"])
        .map("{:+.2f}".format),
    })
    images = {"held-out": "the test images neither network was trained on or reported on",
              "all": "the whole test split where the runs used all of it, as their recorded errors did"}
    compared = ", or ".join(images[c] for c in pairs["compared_on"].unique())
    trained = " or ".join(f"{n:,}" for n in pairs["train_images"].unique())
    caption = (f"Paired comparison, {', '.join(pairs['arch'].unique())}: {comparison}, "
               f"scored image by image on {compared} ({', '.join(pairs['dataset'].unique())}, "
               f"{trained} train images; lead = {lead}, with its paired standard error; "
               f"McNemar's exact two-sided p). Last column: the lead on the images of the runs' recorded errors. "
               f"{rescoring(predictions)}")
    return table.reset_index(drop=True), caption


def rescoring(predictions: pd.DataFrame) -> str:
    """How exactly the scored networks re-score their recorded errors, naming where the inexact
    ones were trained (a GPU's TF32 convolutions can move an image or two that a CPU re-score sees),
    and how many come from their training's per-image record instead (no weights in git)."""
    recorded = from_training_record(predictions)
    return " ".join(filter(None, (rescored(predictions[~recorded]), taken_from_record(predictions[recorded]))))


def from_training_record(predictions: pd.DataFrame) -> pd.Series:
    """Rows taken from a run's summary.json rather than scored from its model.pt."""
    if "scored_from" not in predictions:
        return pd.Series(False, index=predictions.index)
    return predictions["scored_from"] == "summary.json"


def rescored(predictions: pd.DataFrame) -> str:
    if predictions.empty:
        return ""
    gap = (predictions["own_test_error"] - predictions["recorded_test_error"]).abs()
    inexact = predictions[gap >= 1e-9]
    if inexact.empty:
        return f"Each of the {len(predictions)} scored networks re-scores its recorded error exactly."
    return (f"{len(predictions) - len(inexact)} of the {len(predictions)} scored networks re-score their recorded "
            f"error exactly, the other {len(inexact)} (trained on {', '.join(sorted(inexact['run_device'].unique()))}) "
            f"to within {gap.max():.2f} points.")


def taken_from_record(predictions: pd.DataFrame) -> str:
    if predictions.empty:
        return ""
    one = len(predictions) == 1
    return (f"{len(predictions)} more, whose weights git does not keep, {'is' if one else 'are'} taken as "
            f"{'its' if one else 'their'} training recorded {'it' if one else 'them'} "
            f"(right or wrong per image, on {', '.join(sorted(predictions['run_device'].unique()))}).")


def p_value(p: float) -> str:
    return f"{p:.1e}" if p < 0.001 else f"{p:.3f}"


def to_markdown(table: pd.DataFrame, caption: str) -> str:
    header = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(table[c]) else "---" for c in table.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([f"**{caption}**", "", header, rule, *rows]) + "\n"


def latex_escape(text) -> str:
    text = str(text)
    for plain, escaped in (("\\", r"\textbackslash{}"), ("%", r"\%"), ("&", r"\&"), ("_", r"\_"),
                           ("#", r"\#"), ("±", r"$\pm$"), ("−", r"$-$"), ("–", "--")):
        text = text.replace(plain, escaped)
    return text


def to_latex(table: pd.DataFrame, caption: str, label: str) -> str:
    """A booktabs table (\\toprule, \\midrule, \\bottomrule)."""
    align = "".join("r" if pd.api.types.is_numeric_dtype(table[c]) else "l" for c in table.columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption)}}}", rf"\label{{{label}}}",
             rf"\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in table.columns) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(v) for v in row) + r" \\" for row in table.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, caption: str, stem) -> list[Path]:
    """`stem`.csv, `stem`.md and `stem`.tex, each written atomically."""
    stem = Path(stem)
    outputs = {".csv": table.to_csv(index=False), ".md": to_markdown(table, caption),
               ".tex": to_latex(table, caption, f"tab:{stem.name}")}
    paths = []
    for suffix, text in outputs.items():
        atomic_write(stem.with_suffix(suffix), text)
        paths.append(stem.with_suffix(suffix))
    return paths


def table3(bench: pd.DataFrame, runs: pd.DataFrame, reference: pd.DataFrame,
           max_batch: pd.DataFrame | None = None, work: pd.DataFrame | None = None,
           profile: pd.DataFrame | None = None, idle: pd.DataFrame | None = None,
           compiled: pd.DataFrame | None = None) -> tuple[pd.DataFrame, str]:
    """Memory, time overhead and test error per method, ours beside the paper's Table 3; with
    `max_batch` (the search's CSV), each method's largest batch under each cap as well; with
    `work` (the counts' CSV), the extra FLOPs and operators beside the extra time; with `profile`
    (the operator profile's CSV), the extra busy time beside it; with `idle` (`infopro.trace`'s CSV),
    the GPU's idle time a step and how much of it waited for the host's dispatch; with `compiled` (the
    step table timed with compiled modules), the extra time in the grids' training mode."""
    measured = measured_rows(bench).set_index("method")
    order = [m for m in TABLE3_METHODS if m in measured.index]
    first = measured.loc[order[0]]
    column, described = memory_column(measured)
    busy = None if profile is None else busy_times(profile)
    errors, _ = errors_by_method(runs, first["arch"], order)
    paper = reference[(reference["arch"] == first["arch"]) & (reference["dataset"] == "cifar10")]
    paper = {method_label(m, K): row for m, K, (_, row) in zip(paper["method"], paper["K"], paper.iterrows())}
    rows = []
    for method in order:
        ours, ref = measured.loc[method], paper.get(method)
        mean, std, n = errors.get(method, (float("nan"), float("nan"), 0))
        rows.append({
            "method": method,
            "ours: memory (GiB)": f"{ours[column] / 2**30:.2f}",
            "ours: vs E2E": f"{100 * (ours[f'{column}_vs_e2e'] - 1):+.1f}%",
            "ours: time vs E2E": f"{100 * (ours['step_seconds_vs_e2e'] - 1):+.1f}%",
        } | compiled_time(compiled, method) | extra_busy_time(busy, method) | idle_time(idle, method)
          | extra_work(work, method) | {
            "ours: error (%)": mean_std(mean, std), "n": n,
            "paper: memory (GB)": "–" if ref is None else f"{ref['memory_gb']:.2f}",
            "paper: time": "–" if ref is None or pd.isna(ref["overhead_wall_pct"]) else f"+{ref['overhead_wall_pct']:.1f}%",
            "paper: theoretical": "–" if ref is None or pd.isna(ref["overhead_theoretical_pct"])
            else f"+{ref['overhead_theoretical_pct']:.1f}%",
            "paper: error (%)": "–" if ref is None else mean_std(ref["error_mean"], ref["error_std"]),
        } | largest_batches(max_batch, method))
    return pd.DataFrame(rows), table3_caption(first, described, measured, max_batch, work, profile, idle, compiled)


def table3_caption(first: pd.Series, described: str, measured: pd.DataFrame, max_batch: pd.DataFrame | None,
                   work: pd.DataFrame | None, profile: pd.DataFrame | None, idle: pd.DataFrame | None,
                   compiled: pd.DataFrame | None) -> str:
    """What Table 3's columns are and where each came from: the step table's settings (`first`, its first
    method's row; `described`, its memory column), then a sentence for each further input given."""
    caption = (f"Table 3, {first['arch']}, batch {first['batch_size']}, {first['precision']} on {first['device_name']}: "
               f"ours = {described}; median step time over {first['steps']} steps after {first['warmup']} warm-up "
               f"step(s), each method in a fresh process; errors from our training runs where they exist. "
               f"Paper: Titan Xp, 'minimally required' memory and 'theoretical' overhead (methods unpublished), "
               f"cifar10.")
    if remeasured := remeasured_times(measured.reset_index()):
        caption += f" {remeasured[0].upper()}{remeasured[1:]}."
    if compiled is not None:
        caption += (" Time vs E2E, compiled: each local module under torch.compile (the grids' training mode on a "
                    f"GPU), timed in a call of its own at {commits(compiled['git_commit'])} against that call's "
                    "compiled E2E; – : not timed compiled, and checkpointing and offloading step eagerly only).")
    if profile is not None:
        caption += (" Busy time vs E2E: the summed self time of a step's operators (torch.profiler over "
                    f"{', '.join(sorted(profile['steps'].astype(int).astype(str).unique()))} steps after warm-up, "
                    f"at {commits(profile['git_commit'])}; on a GPU the time its kernels keep it busy, idle gaps "
                    "excluded; – : not profiled).")
    if idle is not None:
        caption += (" GPU idle: the time a profiled step left the GPU without a kernel, copy or fill, and in "
                    "brackets the part of it in which the next kernel was not yet launched and the host made no "
                    "synchronisation, allocator or copy call: waiting for the host's dispatch (infopro.trace; the "
                    f"profiler slows the host, so an upper bound; at {commits(idle['git_commit'])}; – : not read).")
    if work is not None:
        caption += (" FLOPs and operators vs E2E: the FLOPs of a step's convolutions and matrix products "
                    "(torch.utils.flop_counter) and the ATen operators it dispatches, views excluded, forward and "
                    f"backward with recomputation, counted on {work['device'].iloc[0]} (FLOPs depend on shapes only; "
                    "– : offload's copies, which happen only on a GPU, were not counted).")
    if max_batch is not None:
        caption += (" Max batch: the largest batch that trains under a real CUDA allocation cap, to within 2% "
                    "(– : not searched; offload's activations live in host memory, which the cap does not bound).")
    return caption


def busy_times(profile: pd.DataFrame) -> pd.Series:
    """method -> the summed self time of all its operators per step (ms): the profile keeps the top
    operators, each with its share of all of them, so their time over their share is the whole.

    Why beside the wall time: the time a GPU spends in kernels is what a method's extra work costs;
    wall time above it is time the GPU waited (for the host, for a copy)."""
    by_method = profile.groupby("method")
    return by_method["self_ms_per_step"].sum() / by_method["share"].sum()


def compiled_time(compiled: pd.DataFrame | None, method: str) -> dict:
    """{"ours: time vs E2E, compiled": "+x%"} of `method` from the compiled step table ({} when it was not
    made; – for a method it did not time)."""
    if compiled is None:
        return {}
    found = compiled.loc[compiled["method"] == method, "step_seconds_vs_e2e"]
    return {"ours: time vs E2E, compiled": "–" if found.empty else f"{100 * (found.iloc[0] - 1):+.1f}%"}


def extra_busy_time(busy: pd.Series | None, method: str) -> dict:
    """{"ours: busy time vs E2E": "+x%"} of `method` from `busy_times` ({} without a profile; – for a
    method not profiled)."""
    if busy is None:
        return {}
    ratio = busy.get(method, float("nan")) / busy.get("e2e", float("nan"))
    return {"ours: busy time vs E2E": "–" if pd.isna(ratio) else f"{100 * (ratio - 1):+.1f}%"}


def idle_time(idle: pd.DataFrame | None, method: str) -> dict:
    """{"ours: GPU idle (ms/step)": "idle (dispatch)"} of `method` from the idle CSV ({} when it was
    not read; – for a method not profiled)."""
    if idle is None:
        return {}
    found = idle[idle["method"] == method]
    if found.empty:
        return {"ours: GPU idle (ms/step)": "–"}
    row = found.iloc[0]
    return {"ours: GPU idle (ms/step)": f"{row['idle_ms_per_step']:.1f} ({row['idle_dispatch_ms_per_step']:.1f})"}


WORK_COLUMNS = {"ours: FLOPs vs E2E": "step_flops_vs_e2e", "ours: operators vs E2E": "step_operators_vs_e2e"}


def extra_work(work: pd.DataFrame | None, method: str) -> dict:
    """{"ours: FLOPs vs E2E": "+x%", "ours: operators vs E2E": ...} of `method` ({} when the work was
    not counted; – where a method or a count is missing)."""
    if work is None:
        return {}
    counted = work.set_index("method")
    ratios = {name: counted[column].get(method) if column in counted else None
              for name, column in WORK_COLUMNS.items()}
    return {name: "–" if ratio is None or pd.isna(ratio) else f"{100 * (ratio - 1):+.1f}%"
            for name, ratio in ratios.items()}


def largest_batches(max_batch: pd.DataFrame | None, method: str) -> dict:
    """{"ours: max batch in C GiB": batch} for each cap of the search ({} when it was not run)."""
    if max_batch is None:
        return {}
    found = max_batch[(max_batch["method"] == method) & max_batch["max_batch"].notna()]
    found = dict(zip(found["cap_gib"], found["max_batch"]))
    return {f"ours: max batch in {cap:g} GiB": f"{int(found[cap])}" if cap in found else "–"
            for cap in sorted(max_batch["cap_gib"].unique())}
