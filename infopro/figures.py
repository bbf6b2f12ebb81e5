"""What each figure and table is built from, and building it: the code behind `make figN`.

Everything is read from files under results/ (runs, analysis CSVs, the paper's reference
values); nothing here trains or estimates. A missing input stops with one line that names
the command making it and what that costs.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from infopro import claims, layer_plots, plots, remainder_budget, selection, tables
from infopro.errors import InfoProError
from infopro.models import ARCHS
from infopro.paired import read_predictions
from infopro.records import read_table
from infopro.runs import find_runs, runs_table, schedule_pairs, training_curves

# How to make each input, and what it cost when we made it (see README, "What each step costs").
HOW_TO_MAKE = {
    "runs": "train them with `python -m experiments.grid table2-resnet32 --out results/runs` (the paper's "
            "grid: on one H100, four runs at a time, 11 to 12 min per 160-epoch run of E2E or greedy SL and "
            "12.5 min for InfoPro (Contrast) K=2, more as K grows) or `make fixture` (the small CPU fixture: "
            "3.3 h on 2 CPU cores)",
    "probes": "make it with `make probes` (linear probes of every finished run, on 2 CPU cores: 25 s per "
              "fixture run, about 1.5 min per 160-epoch run of 50,000 images)",
    "bench": "make it with `make bench` (every method in a fresh process: on one H100, all 16 methods and "
             "the pipeline comparison took 5.7 min; on 2 CPU cores a ResNet-110 step at batch 1024 takes "
             "about 30 s, and the committed CPU run of 8 methods took 22 min)",
    "mutual-info": "make it with `make mutual-info` (a decoder and a classifier per layer of every finished "
                   "run; the committed fixture's settings, MI_ARGS='--train-subset 2000 --test-subset 1000 --epochs 10', "
                   "took about 4 min per run on 2 CPU cores)",
    "schedule-check": "make it with `python -m experiments.grid cpu-schedule-check --device cpu --out "
                      "results/schedule-check` (the fixture's E2E, greedy SL, InfoPro (Contrast, Softmax) and DGL at "
                      "K=2, 4, 8 and 16, 36 epochs: per seed on 2 CPU cores, 1.5 h for K=2, 2.2 h for E2E and K=4, "
                      "2.3 h for K=8 and about 3.3 h for K=16), beside `make fixture`'s runs of the same seeds",
    "test-predictions": "make it with `make test-predictions` (every run with committed weights scored image by "
                        "image on its whole test split: about 30 s per ResNet-32 on 10,000 images on 2 CPU cores)",
    "remainder": "make it with `python -m analysis.remainder ceiling` and `layers` (remainder_budget.csv: `budget`) on "
                 "a GPU (the remainder estimator: up to eight ResNet-32 trainings of its budget per network; see "
                 "docs/analysis.md)",
    "schedule-analysis": "make it with `make schedule-analysis` (linear probes, I(h,x) and I(h,y) of the schedule "
                         "check's runs that the Makefile's SCHEDULE_RUNS names and of their 12-epoch twins: about "
                         "150 min on 2 CPU cores)",
}


# The columns the figures group and draw by; an analysis CSV without them is refused in one line.
LAYER_COLUMNS = ("run_id", "regime", "K", "seed", "recipe", "epochs", "train_images", "layer", "arch", "split")
PROBE_COLUMNS = LAYER_COLUMNS + ("test_error",)
MI_COLUMNS = LAYER_COLUMNS + ("estimator", "ixx_normalised", "ixy_normalised")
BENCH_COLUMNS = ("method", "arch", "device", "batch_size", "precision")


def require(path: Path, maker: str) -> Path:
    if not path.exists():
        raise InfoProError(f"{path} is missing: {HOW_TO_MAKE[maker]}")
    return path


def read_result(path: Path, maker: str, columns: tuple[str, ...], rows=None) -> pd.DataFrame:
    """A results CSV that `maker` makes (`rows`: see `read_table`): missing or unreadable, it is one
    line saying how to make it again."""
    return read_table(require(path, maker), f"restore it from git, or delete it and {HOW_TO_MAKE[maker]}", columns,
                      rows)


def load_runs(results) -> pd.DataFrame:
    runs = runs_table(Path(results) / "runs")
    if runs.empty:
        raise InfoProError(f"no finished runs under {Path(results) / 'runs'}: {HOW_TO_MAKE['runs']}")
    return runs


def load_curves(results) -> pd.DataFrame:
    """Every run's errors per epoch, unfinished runs included."""
    curves = training_curves(Path(results) / "runs")
    if curves.empty:
        raise InfoProError(f"no run under {Path(results) / 'runs'} has finished an epoch: {HOW_TO_MAKE['runs']}")
    return curves


def load_probes(results) -> pd.DataFrame:
    return read_result(Path(results) / "analysis" / "linear_probe.csv", "probes", PROBE_COLUMNS)


def load_mutual_info(results) -> pd.DataFrame:
    return read_result(Path(results) / "analysis" / "mutual_information.csv", "mutual-info", MI_COLUMNS)


def load_ceilings(results) -> pd.DataFrame | None:
    """The remainder estimator's ceilings (analysis/remainder_ceiling.csv), or None before any was measured."""
    path = Path(results) / "analysis" / "remainder_ceiling.csv"
    return read_result(path, "remainder", ("arch", "recipe", "rem_epochs", "ixy_paper")) if path.exists() else None


def load_schedule_pairs(results) -> pd.DataFrame:
    """The schedule check's longer runs, each beside its fixture run with fewer epochs."""
    longer = find_runs(require(Path(results) / "schedule-check", "schedule-check"))
    pairs = schedule_pairs(find_runs(Path(results) / "runs"), longer)
    if pairs.empty:
        raise InfoProError(f"no run under {Path(results) / 'schedule-check'} has a twin with fewer epochs under "
                           f"{Path(results) / 'runs'}: {HOW_TO_MAKE['schedule-check']}")
    return pairs


def load_schedule_analysis(results) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Probe and mutual-information rows of the configurations and seeds analysed after two schedule lengths."""
    folder = Path(results) / "analysis" / "schedule-check"
    probes, mi = (layer_plots.paired_schedules(selection.with_method(read_result(folder / name, "schedule-analysis", columns)))
                  for name, columns in (("linear_probe.csv", PROBE_COLUMNS), ("mutual_information.csv", MI_COLUMNS)))
    if probes.empty or mi.empty:
        raise InfoProError(f"{folder} holds no configuration analysed after two schedule lengths: "
                           f"{HOW_TO_MAKE['schedule-analysis']}")
    return probes, mi


def load_test_predictions(results) -> pd.DataFrame:
    return read_predictions(require(Path(results) / "analysis" / "test_predictions.csv", "test-predictions"))


def load_bench(results) -> pd.DataFrame:
    """One benchmark table per architecture: CUDA measurements over CPU ones, then the largest batch.

    Step tables are the files named <arch>-b<batch>-<precision>-<device>.csv; the other CSVs in
    bench/ (max batch, pipeline, module-parallel, grid jobs) are other measurements.
    """
    files = [path for path in sorted((Path(results) / "bench").glob("*.csv"))
             if any(path.name.startswith(f"{arch}-b") for arch in ARCHS)]
    if not files:
        raise InfoProError(f"{Path(results) / 'bench'} holds no benchmark CSV: {HOW_TO_MAKE['bench']}")
    tables = [read_result(path, "bench", BENCH_COLUMNS).assign(source_file=path.name) for path in files]
    best = {}
    for table in tables:
        first = table.iloc[0]
        rank = (first["device"] == "cuda", first["batch_size"])
        if first["arch"] not in best or rank > best[first["arch"]][0]:
            best[first["arch"]] = (rank, table)
    return pd.concat([with_remeasured_times(results, table) for _, table in best.values()], ignore_index=True)


TIME_COLUMNS = ("step_seconds", "step_seconds_min", "step_seconds_max", "images_per_second", "step_seconds_vs_e2e")


def with_remeasured_times(results, table: pd.DataFrame) -> pd.DataFrame:
    """The step table with the times of the methods a later call measured again, and `timed_at`: the
    commit each row's time was measured at.

    Why: a change to the training step can change its time but not its memory (taking the host copies
    out of the contrastive loss did), and re-measuring the methods it touches takes minutes of a GPU
    where the whole table takes a quarter of an hour. That later call (`experiments.bench --measure steps --methods
    e2e ... --out results/bench/remeasured`) writes a step table of the same name under remeasured/;
    each of its time ratios is against its own E2E, since times compare only within one call. A
    method the full table lacks is not added: the rows stay the full call's.
    """
    table = table.assign(timed_at=table["git_commit"])
    path = Path(results) / "bench" / "remeasured" / table["source_file"].iloc[0]
    if not path.is_file():
        return table
    later = later_step_table(path, BENCH_COLUMNS + TIME_COLUMNS + ("git_commit",))
    later = later.set_index("method")[list(TIME_COLUMNS) + ["git_commit"]].rename(columns={"git_commit": "timed_at"})
    table = table.set_index("method")
    table.update(later)
    return table.reset_index()


def table3_bench(results) -> pd.DataFrame:
    """The benchmark Table 3 is about: ResNet-110 (the paper's) when measured, else the first."""
    bench = load_bench(results)
    arch = "resnet110" if "resnet110" in set(bench["arch"]) else bench["arch"].iloc[0]
    return bench[bench["arch"] == arch]


def max_batch_path(results, bench: pd.DataFrame) -> Path:
    """Where the max-batch search of the step table's architecture, precision and GPU is written."""
    first = bench.iloc[0]
    prefix = f"{first['arch']}-b{first['batch_size']}-{first['precision']}-"
    device = first["source_file"].removeprefix(prefix).removesuffix(".csv")
    return Path(results) / "bench" / f"{first['arch']}-{first['precision']}-{device}-maxbatch.csv"


def load_max_batch(results, bench: pd.DataFrame) -> pd.DataFrame | None:
    """The max-batch search of the step table's architecture, precision and GPU, if it was run."""
    path = max_batch_path(results, bench)
    return read_result(path, "bench", ("method", "cap_gib")) if path.is_file() else None  # max_batch: blank on error


# What is measured beside a step table, as <kind>-<its name>.csv, and the columns each needs: the operator profile
# of its methods, and where the GPU's idle time went in the profiled steps (`infopro.trace`, GPU only).
BESIDE_STEPS = {"profile": ("method", "self_ms_per_step", "share", "steps", "git_commit"),
                "idle": ("method", "idle_ms_per_step", "idle_dispatch_ms_per_step", "git_commit")}


def load_beside_steps(results, bench: pd.DataFrame, kind: str) -> pd.DataFrame | None:
    """The measurement `kind` (BESIDE_STEPS) of the step table's architecture, batch, precision and device:
    its measured methods, or None when it was not made or no method was measured."""
    path = Path(results) / "bench" / f"{kind}-{bench['source_file'].iloc[0]}"
    if not path.is_file():
        return None
    table = read_result(path, "bench", BESIDE_STEPS[kind], selection.measured_rows)
    return None if table.empty else table


def load_compiled(results, bench: pd.DataFrame) -> pd.DataFrame | None:
    """The step table's twin timed with compiled local modules (`experiments.bench --step compiled`, under
    bench/compiled/), its measured methods, if it was made. Its time ratios are against its own E2E:
    times compare only within one call."""
    path = Path(results) / "bench" / "compiled" / bench["source_file"].iloc[0]
    if not path.is_file():
        return None
    return later_step_table(path, ("method", "step_seconds_vs_e2e", "git_commit"))


def later_step_table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """The measured methods of a step table from a call of its own, which must have timed E2E: its time
    ratios are against its own E2E."""
    table = read_result(path, "bench", columns, selection.measured_rows)
    if "e2e" not in set(table["method"]):
        raise InfoProError(f"{path} holds no E2E step: its time ratios are against its own E2E; "
                           f"measure again with e2e among --methods")
    return table


def load_work(results, bench: pd.DataFrame) -> pd.DataFrame | None:
    """The work counts of the step table's architecture and batch, if they were made (on any device:
    FLOPs depend on shapes only). Operators may be blank: offload's, counted off a GPU."""
    first = bench.iloc[0]
    path = Path(results) / "bench" / f"work-{first['arch']}-b{first['batch_size']}.csv"
    return read_result(path, "bench", ("method", "step_flops_vs_e2e", "device")) if path.is_file() else None


def memory_figure(results):
    """fig_memory from every architecture's step table, the runs, and the work counted at its batch."""
    bench = load_bench(results)
    work = {arch: load_work(results, rows) for arch, rows in bench.groupby("arch", sort=False)}
    return plots.fig_memory(bench, runs_or_empty(results), {arch: w for arch, w in work.items() if w is not None})


def table3(results) -> tuple[pd.DataFrame, str]:
    """Table 3 and its caption: the step table, test errors of runs, the paper's values, max batch if
    searched, the work of a step if counted, its busy time if profiled, its GPU's idle time if read and
    its compiled step times if timed."""
    bench = table3_bench(results)
    return tables.table3(bench, runs_or_empty(results), load_reference(results, "table3"),
                         load_max_batch(results, bench), load_work(results, bench),
                         load_beside_steps(results, bench, "profile"), load_beside_steps(results, bench, "idle"),
                         load_compiled(results, bench))


def runs_or_empty(results) -> pd.DataFrame:
    """Finished runs, or an empty table: memory results stand without test errors."""
    return runs_table(Path(results) / "runs")


def load_reference(results, name: str) -> pd.DataFrame:
    """The paper's values (results/reference/<name>.csv), each row with its source."""
    return read_table(Path(results) / "reference" / f"{name}.csv", "restore it from git (the paper's values, "
                      "each with its source)", keep_default_na=False, na_values=[""])


# Names of the committed recipes: the paper's (the default) and the CPU fixture's (a toy, on request).
RECIPE_NAMES = {"paper": "160 epochs", "fixture": "12 epochs"}


def recipe_rows(df: pd.DataFrame, text: str) -> pd.DataFrame:
    """The rows of the one recipe whose label contains `text` (e.g. "160 epochs", or a name of
    RECIPE_NAMES), for a figure of another recipe than the default (selection.main_recipe)."""
    recipes = sorted(recipe for recipe in df["recipe"].unique() if RECIPE_NAMES.get(text, text) in recipe)
    if len(recipes) != 1:
        found = "several recipes match" if recipes else "no recipe matches"
        raise InfoProError(f"{found} --recipe {text!r}; the recipes in results are: "
                           f"{'; '.join(sorted(df['recipe'].unique()))}")
    return df[df["recipe"] == recipes[0]]


def arch_rows(df: pd.DataFrame, arch: str) -> pd.DataFrame:
    """The rows of one network, for a figure or table of it when another network covers more."""
    rows = df[df["arch"] == arch]
    if rows.empty:
        networks = ", ".join(sorted(df["arch"].unique()))
        raise InfoProError(f"no run of {arch} here; the networks in results are: {networks}")
    return rows


ESTIMATORS = {"remainder": "remainder", "1c2f": "mutual-info"}  # of I(h,x), I(h,y) -> what makes its rows


def estimator_rows(df: pd.DataFrame, estimator: str | None) -> pd.DataFrame:
    """The rows of one estimator of I(h,x) and I(h,y): `estimator`, or by default
    `selection.default_estimator`'s."""
    estimator = estimator or selection.default_estimator(df)
    rows = df[df["estimator"] == estimator]
    if rows.empty:
        raise InfoProError(f"no {estimator} rows in the mutual-information CSV: {HOW_TO_MAKE[ESTIMATORS[estimator]]}")
    return rows


@dataclass(frozen=True)
class RowPicker:
    """The rows a target draws: those of `arch`, of the recipe whose label contains `recipe` and, in
    the mutual-information rows, of one estimator (`estimator_rows`, whose default depends on the
    recipe shown, so it comes last) unless not `one_estimator` (the claims read each estimator's
    rows themselves); the figures then pick as by default among what is left."""

    recipe: str | None = None
    arch: str | None = None
    estimator: str | None = None
    one_estimator: bool = True

    def __call__(self, df: pd.DataFrame) -> pd.DataFrame:
        df = df if self.arch is None else arch_rows(df, self.arch)
        df = df if self.recipe is None else recipe_rows(df, self.recipe)
        return estimator_rows(df, self.estimator) if self.one_estimator and "estimator" in df else df


def recipe_slug(recipe: str) -> str:
    """A recipe's text as a file name's part: `make fig8 RECIPE=fixture` writes fig8-fixture.png."""
    return re.sub(r"[^a-z0-9]+", "-", recipe.lower()).strip("-")


def claims_table(results, pick=RowPicker(one_estimator=False)) -> tuple[pd.DataFrame, str]:
    """The paper's claims with our verdicts (infopro/claims.py), from the default rows of every target
    among the runs and analyses `pick` keeps. Those of a recipe (`pick.recipe`) point at that recipe's
    figures and tables; Table 3's claim is the same in every recipe's table."""
    bench = selection.measured_rows(table3_bench(results))
    table, caption = claims.claims(pick(load_runs(results)), pick(load_probes(results)),
                                   pick(load_mutual_info(results)), bench, selection.memory_column(bench)[0],
                                   load_reference(results, "table2"), load_reference(results, "analysis_figure"),
                                   load_reference(results, "table3"))
    return (table if pick.recipe is None else claims.of_recipe(table, recipe_slug(pick.recipe))), caption


def load_budget_check(results) -> dict[str, pd.DataFrame | None]:
    """The budget check's rows (read first: a missing check is what the error names), the figure's, the ceilings."""
    return dict(longer=read_result(Path(results) / "analysis" / "remainder_budget.csv", "remainder", MI_COLUMNS),
                mi=load_mutual_info(results), ceilings=load_ceilings(results))


# Each target from the results folder and a selection of rows (`RowPicker`: all rows by default).
FIGURES = {
    "fig7": lambda r, pick: plots.fig7_error_vs_k(pick(load_runs(r)), load_reference(r, "table2")),
    "fig8": lambda r, pick: layer_plots.fig8_linear_probes(pick(load_probes(r)), load_reference(r, "analysis_figure")),
    "fig10": lambda r, pick: layer_plots.fig10_mutual_information(pick(load_mutual_info(r)),
                                                            load_reference(r, "analysis_figure"), load_ceilings(r)),
    "fig_info_plane": lambda r, pick: layer_plots.fig_information_plane(pick(load_mutual_info(r))),
    "fig_curves": lambda r, pick: plots.fig_training_curves(pick(load_curves(r))),
    "fig_memory": lambda r, pick: memory_figure(r),
    "fig_schedule": lambda r, pick: layer_plots.fig_schedule(*load_schedule_analysis(r)),
}
TABLES = {
    "table2": lambda r, pick: tables.table2(pick(load_runs(r)), load_reference(r, "table2")),
    "table3": lambda r, pick: table3(r),
    "table_schedule": lambda r, pick: tables.schedule_check(load_schedule_pairs(r)),
    "table_paired": lambda r, pick: tables.paired(load_test_predictions(r)),
    "table_e2e_gap": lambda r, pick: tables.e2e_gap(load_test_predictions(r)),
    "table_ranking": lambda r, pick: tables.ranking(load_test_predictions(r)),
    "table_remainder_budget": lambda r, pick: remainder_budget.budget_table(**load_budget_check(r)),
    "table_remainder_budget_means": lambda r, pick: remainder_budget.budget_means_table(**load_budget_check(r)),
    "claims": claims_table,
}
TARGETS = (*FIGURES, *TABLES)
ARCH_TARGETS = ("fig7", "fig8", "fig10", "fig_info_plane", "fig_curves", "table2")  # show one network of the runs
# The targets that show one recipe of the runs: the claims too, judged by the same rules in a CPU fixture.
RECIPE_TARGETS = (*ARCH_TARGETS, "claims")
ESTIMATOR_TARGETS = ("fig10", "fig_info_plane")  # the targets that show one estimator of I(h,x), I(h,y)


def refuse_unless(target: str, option: str, targets: tuple[str, ...]) -> None:
    if target not in targets:
        raise InfoProError(f"--{option} applies to {', '.join(targets)}, not {target}")


def build(target: str, results="results", recipe: str | None = None, arch: str | None = None,
          estimator: str | None = None) -> list[Path]:
    """Build one figure (results/figures/<target>.png and .pdf) or table (results/tables/<target>.*).

    With `recipe`, a target of RECIPE_TARGETS shows the runs of the recipe whose label contains
    that text; with `arch`, a target of ARCH_TARGETS shows that network's runs (where another
    network covers more configurations). Either writes <target>[-<arch>][-<recipe, slugged>].*,
    beside the default. With `estimator`, fig10 and fig_info_plane draw that estimator's rows, as
    <target>-<estimator>.*.
    """
    if target not in TARGETS:
        raise InfoProError(f"unknown target {target!r}; valid: {', '.join(TARGETS)}")
    if recipe is not None:
        refuse_unless(target, "recipe", RECIPE_TARGETS)
    if arch is not None:
        refuse_unless(target, "arch", ARCH_TARGETS)
    if estimator is not None:
        refuse_unless(target, "estimator", ESTIMATOR_TARGETS)
    results = Path(results)
    slug = None if recipe is None else recipe_slug(recipe)
    stem = "-".join(part for part in (target, arch, slug, estimator) if part)
    pick = RowPicker(recipe, arch, estimator, one_estimator=target in ESTIMATOR_TARGETS)
    if target in FIGURES:
        return plots.save_figure(FIGURES[target](results, pick), results / "figures" / stem)
    table, caption = TABLES[target](results, pick)
    return tables.write_table(table, caption, results / "tables" / stem)
