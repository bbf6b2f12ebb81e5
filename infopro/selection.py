"""Which result rows a figure or table shows: the method of each row, the recipe and network shown
by default (the paper's), the measured rows of a benchmark and the memory column it reports.

Figures (infopro/plots.py, infopro/layer_plots.py), tables (infopro/tables.py) and the claims
(infopro/claims.py) all pick their rows here, so they always show the same runs.
"""

import pandas as pd

from infopro.bench_methods import WHOLE_NETWORK
from infopro.config import method_name
from infopro.errors import InfoProError
from infopro.splits import key_layer_points

ANALYSIS_FIGURE_ARCH = "resnet32"  # the network of the paper's analysis figure (results/reference/analysis_figure.csv)
# The paper's ranking of the locally supervised methods by test error at each K (its Table 2), best first.
PAPER_RANKING = ("infopro-contrast", "infopro-softmax", "dgl", "greedy")


def with_method(df: pd.DataFrame) -> pd.DataFrame:
    """Add a `method` column (e2e, greedy, dgl, infopro-contrast, infopro-softmax)."""
    task = df["task_loss"].astype(object).fillna("") if "task_loss" in df else ""
    return df.assign(method=[method_name(r, t) for r, t in zip(df["regime"], task)])


def seeds_at_every_point(rows: pd.DataFrame, values: str | list[str]) -> pd.DataFrame:
    """`rows` of one network configuration, of the seeds read (any of `values`) at every layer point that any
    of its seeds is read at; all of them where no seed is. A mean over these never changes seed set from one
    layer point to the next: a seed estimated at a few points only (the CPU fixture's third, at module ends)
    would otherwise put a step into a curve that is a difference between seeds."""
    read = rows.dropna(subset=[values] if isinstance(values, str) else list(values), how="all")
    points = read.groupby("seed")["layer"].nunique()
    complete = points.index[points == read["layer"].nunique()]
    return rows[rows["seed"].isin(complete)] if len(complete) else rows


def training_by_recipe(df: pd.DataFrame, by=("recipe",)) -> pd.Series:
    """recipe (or the columns `by`) -> how much training it holds (images x epochs): which recipe is
    the most-trained."""
    return (df["train_images"] * df["epochs"]).groupby([df[column] for column in by]).max()


def main_recipe(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows of the architecture and recipe a figure shows by default, and the recipe's label: the
    most-trained recipe (images x epochs: the paper's, 160 epochs on the whole training set), then the
    one covering the most configurations (method, K, split).

    results/ also holds a small CPU fixture of every configuration; it is a toy for CPU demos and
    tests, drawn only on request (`--recipe fixture`). A recipe's label does not name the network,
    so ResNet-110 runs of the paper's recipe are told from ResNet-32's by `arch`; on a tie the
    paper's analysis network, ResNet-32, is shown.
    """
    if df.empty:
        return df, ""
    keys = ["arch", "recipe"]
    configurations = df.drop_duplicates([*keys, "method", "K", "split"]).groupby(keys).size()
    training = training_by_recipe(df, keys)
    arch, recipe = max(configurations.index,
                       key=lambda key: (training[key], configurations[key], key[0] == ANALYSIS_FIGURE_ARCH))
    return df[(df["arch"] == arch) & (df["recipe"] == recipe)], recipe


def equal_depth(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of runs cut at the paper's equal-depth split points (Table 2 and the analysis figures).
    InfoPro*'s memory-balanced splits are Table 3's: at K = 2 both exist, and averaged together
    they would be no configuration at all."""
    return df[df["split"] == "paper"]


def figure_rows(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """What a figure of Table 2's configurations shows (fig7, fig8, fig10, the information plane):
    equal-depth runs of the main architecture and recipe, with a `method` column; and the recipe.
    Table 2 shows every recipe of that architecture."""
    rows, recipe = main_recipe(equal_depth(with_method(df)))
    if rows.empty:
        raise InfoProError("no run here is cut at the paper's equal-depth split points (split 'paper'), the only "
                           "ones this shows; InfoPro*'s balanced runs enter Table 3 and fig_memory")
    return rows, recipe


# The networks of the paper's analysis figure: E2E and greedy SL at every K.
PAPER_FIGURE_NETWORKS = (("e2e", 1), ("greedy", 2), ("greedy", 4), ("greedy", 8), ("greedy", 16))


def key_points_of(row: pd.Series) -> list[int]:
    """`splits.key_layer_points` of the network an analysis row belongs to."""
    return key_layer_points(row["arch"], int(row["K"]), row["split"])


def covered_networks(mi: pd.DataFrame, estimator: str) -> set:
    """(method, K) of the runs whose `estimator` rows cover every key layer point of their network
    (layer 1, its module ends and its last; every point of E2E). The remainder estimator's points of
    one network arrive over several GPU calls, the key points first."""
    own = with_method(mi[mi["estimator"] == estimator])
    covered = [run_id for run_id, rows in own.groupby("run_id")
               if set(key_points_of(rows.iloc[0])) <= set(rows["layer"])]
    return set(own.loc[own["run_id"].isin(covered), ["method", "K"]].itertuples(index=False, name=None))


def default_estimator(mi: pd.DataFrame) -> str:
    """The estimator of I(h,x) and I(h,y) shown by default: the remainder estimator (the paper's
    units) once it covers the key layer points of the paper's figure networks in the recipe and
    network a figure of `mi` shows (`figure_rows`), else 1c2f, which covers every layer of every
    network. A figure half in one estimator's units and half in the other's would compare nothing,
    and another recipe's remainder rows (a CPU fixture's) say nothing of the shown recipe's."""
    shown, _ = figure_rows(mi)
    return "remainder" if set(PAPER_FIGURE_NETWORKS) <= covered_networks(shown, "remainder") else "1c2f"


def other_estimators(mi: pd.DataFrame) -> list[str]:
    """The estimators with rows in what a figure of `mi` shows (`figure_rows`) other than its default: each
    is drawn beside it as <target>-<estimator> (`make figures`), so that every committed figure rebuilds
    whichever estimator is the default."""
    shown, _ = figure_rows(mi)
    return sorted(set(shown["estimator"]) - {default_estimator(mi)})


def measured_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of a benchmark CSV whose method was measured: a failed method's row holds its `error`."""
    return rows[rows["error"].isna()] if "error" in rows else rows


def commits(column: pd.Series) -> str:
    """The short commits a column of full ones holds, in order of first appearance."""
    return ", ".join(dict.fromkeys(commit[:7] for commit in column.astype(str)))


def remeasured_times(bench: pd.DataFrame) -> str:
    """Which methods' step times a later call measured, for a caption or footer ("" when none):
    the step table's times and ratios then come from two calls."""
    later = bench[bench["timed_at"] != bench["git_commit"]] if "timed_at" in bench else bench.iloc[:0]
    if later.empty:
        return ""
    if len(later) == len(bench):
        return (f"step times of every method re-measured at {commits(later['timed_at'])} (bench/remeasured/), "
                f"against that call's E2E; memory from the step table at {commits(bench['git_commit'])}")
    return (f"step times of {', '.join(later['method'])} re-measured at {commits(later['timed_at'])} "
            f"(bench/remeasured/), each against that call's E2E; the others at {commits(bench['git_commit'])}")


TABLE3_METHODS = ("e2e", "checkpoint", "offload", "infopro-balanced:2", "infopro-balanced:3", "infopro-balanced:4",
                  "infopro:2", "infopro:4", "infopro:8", "infopro:16", "infopro+checkpoint:2",
                  "infopro+checkpoint:4", "greedy:2", "greedy:4", "greedy:8", "greedy:16")


def method_label(method: str, K: int) -> str:
    """The benchmark's name of a method: "e2e", "checkpoint", "infopro-balanced:4", ..."""
    return method if K == 1 else f"{method}:{K}"


def run_of_method(method: str) -> tuple[str, int, str]:
    """The training run whose test error a benchmark method shares: (method key, K, split)."""
    family, _, k = method.partition(":")
    K = int(k) if k else 1
    if family in WHOLE_NETWORK:
        return "e2e", 1, "paper"
    if family in ("greedy", "dgl", "infopro-softmax"):
        return family, K, "paper"
    return "infopro-contrast", K, "balanced" if family == "infopro-balanced" else "paper"


def errors_by_method(runs: pd.DataFrame, arch: str, methods) -> tuple[dict, str]:
    """method -> (mean, std, n) of final test error over the main recipe's runs of `arch`; and
    that recipe ("" without runs of `arch`)."""
    runs = runs[runs["arch"] == arch] if not runs.empty else runs
    if runs.empty:
        return {}, ""
    runs, recipe = main_recipe(with_method(runs))
    errors = {}
    for method in methods:
        key, K, split = run_of_method(method)
        chosen = runs[(runs["method"] == key) & (runs["K"] == K) & (runs["split"] == split)]["final_test_error"]
        if len(chosen):
            errors[method] = (chosen.mean(), chosen.std(), len(chosen))
    return errors, recipe


def memory_column(bench: pd.DataFrame) -> tuple[str, str]:
    """(column, description) of the memory a table or figure shows: CUDA allocated when measured
    on a GPU, else the exact device-independent peak of the step's tensors."""
    if bench["peak_allocated_bytes"].notna().any():
        return "peak_allocated_bytes", "peak max_memory_allocated"
    return "peak_step_tensor_bytes", "peak bytes of tensors the step allocates (exact, device-independent)"
