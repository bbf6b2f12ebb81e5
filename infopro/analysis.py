"""Per-layer analyses of finished runs (linear probes, I(h,x) and I(h,y)) into result CSVs.

I(h,x) and I(h,y) come from two estimators, told apart by the `estimator` column of
mutual_information.csv: `remainder` (infopro/remainder.py: the paper's units, a fresh copy of
the rest of the network on the frozen h) and `1c2f` (infopro/mi.py: usable information to a
small head).

Each analysed run adds one row per layer point, carrying the run's description (regime,
K, seed, recipe, the commit that trained it), whether the layer ends a local module, the
analysis settings, and the commit and device of the analysis itself. The CSV is rewritten
atomically after every run, and runs already analysed with the same settings are skipped,
so an interrupted `make probes` loses nothing and a re-run only does what is missing.
"""

from dataclasses import replace
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from infopro.device import place
from infopro.errors import InfoProError
from infopro.mi import EstimatorSettings, information_about_x, information_about_y
from infopro.probes import DEFAULT_L2, check_l2, check_pool, extract_features, frozen, probe_layers
from infopro.records import check_writable, device_name, equal_as_read, git_state, read_table, update_csv
from infopro.remainder import RemainderSettings, ceiling_within, estimate
from infopro.remainder_steps import measure_steps
from infopro.runs import Run
from infopro.splits import key_layer_points, num_layer_points


def run_splits(run: Run, train_subset, test_subset, device, data_root):
    """The run's own train and test images (optionally fewer), on `device`."""
    data = run.load_data(data_root)
    return data.train.subset(train_subset).to(device), data.test.subset(test_subset).to(device)


def image_counts(run: Run, train_subset, test_subset, prefix: str) -> dict:
    """How many of the run's train/test images an analysis uses, known before loading them."""
    sizes = run.record["dataset"]
    return {f"{prefix}_train_images": min(train_subset or sizes["train_size"], sizes["train_size"]),
            f"{prefix}_test_images": min(test_subset or sizes["test_size"], sizes["test_size"])}


def probe_settings(run: Run, pool="gap", l2=DEFAULT_L2, train_subset=None, test_subset=None) -> dict:
    return {"pool": check_pool(pool), "l2": check_l2(l2)} | image_counts(run, train_subset, test_subset, "probe")


def mutual_info_settings(run: Run, settings=EstimatorSettings(), train_subset=None, test_subset=None) -> dict:
    return {"estimator": "1c2f"} | settings.as_columns() | image_counts(run, train_subset, test_subset, "mi")


def remainder_settings(run: Run, settings=RemainderSettings()) -> dict:
    """The remainder estimator always uses the run's whole train and test splits."""
    return {"estimator": "remainder"} | settings.as_columns() | image_counts(run, None, None, "mi")


def layer_rows(run: Run, results: list[dict], settings: dict, device: torch.device) -> list[dict]:
    """Rows for one run: run description + layer + module-end flag + settings + the analysis's device."""
    ends = set(run.module_ends)
    return [run.row() | {"layer": r["layer"], "module_end": r["layer"] in ends} | settings | r
            | analysis_device(device) for r in results]


def analysis_device(device: torch.device) -> dict:
    """The device of the analysis itself (the run's own is in `Run.row`)."""
    return {"analysis_device": device_name(device)}


def analysis_code() -> dict:
    """The commit and dirty flag of the analysis's code, taken when a command's loop over runs starts
    (`analyse_runs`, `measure_ceilings`, `paired.predict_runs`) and given to every row it writes: the
    code a process runs is the code it loaded, whatever is committed while an analysis of hours runs."""
    git = git_state()
    return {"analysis_commit": git["git_commit"], "analysis_dirty": git["git_dirty"]}


def probe_run(run: Run, layers, *, pool="gap", l2=DEFAULT_L2, train_subset=None, test_subset=None,
              device=torch.device("cpu"), data_root=None, log=print) -> list[dict]:
    """Linear-probe train/test error at each layer point of the run's frozen backbone."""
    settings = probe_settings(run, pool, l2, train_subset, test_subset)
    train, test = run_splits(run, train_subset, test_subset, device, data_root)
    backbone = run.load_net(device).backbone
    results = probe_layers(backbone, train, test, layers, pool, l2, log=log)
    return layer_rows(run, results, settings, device)


def mutual_info_run(run: Run, layers, *, settings=EstimatorSettings(), train_subset=None,
                    test_subset=None, device=torch.device("cpu"), data_root=None, log=print) -> list[dict]:
    """Î(h;x) and Î(h;y) at each layer point, one layer's features in memory at a time."""
    columns = mutual_info_settings(run, settings, train_subset, test_subset)
    train, test = run_splits(run, train_subset, test_subset, device, data_root)
    backbone = run.load_net(device).backbone
    results = []
    with frozen(backbone):
        for layer in layers:
            train_h = extract_features(backbone, train, [layer], lambda h: h)[layer]
            test_h = extract_features(backbone, test, [layer], lambda h: h)[layer]
            result = {"layer": layer}
            result |= information_about_y(train_h, train.labels, test_h, test.labels, settings)
            result |= information_about_x(train_h, train.images, test_h, test.images, settings)
            results.append(result)
            log(f"  layer {layer:>2}: I(h,x) {result['ixx_normalised']:.3f}  I(h,y) {result['ixy_normalised']:.3f}")
    return layer_rows(run, results, columns, device)


def remainder_run(run: Run, layers, *, settings=RemainderSettings(), device=torch.device("cpu"), data_root=None,
                  log=print, step: str = "eager") -> list[dict]:
    """I(h,y) and I(h,x) in the paper's units at each layer point, every point trained in one pass whose
    steps run in `step` mode (`infopro.remainder.STEPS`)."""
    columns = remainder_settings(run, settings)
    train, test = run_splits(run, None, None, device, data_root)
    backbone = place(run.load_net(device).backbone, device)
    return layer_rows(run, estimate(backbone, train, test, layers, settings, log, step), columns, device)


def ceiling_run(run: Run, settings=RemainderSettings(), device=torch.device("cpu"), data_root=None,
                log=print, step: str = "eager") -> dict:
    """The ceiling of `settings`' budget (the run's architecture trained from the image itself on the run's
    data) beside the run's own test accuracy, as one row of remainder_ceiling.csv."""
    train, test = run_splits(run, None, None, device, data_root)
    backbone = run.load_net(device).backbone  # only its architecture is used at point 0
    ceiling = estimate(backbone, train, test, [0], settings, log, step)[0]
    network = 1 - run.summary["final_test_error"] / 100
    return (run.row() | remainder_settings(run, settings) | ceiling | {"network_accuracy": network,
            "within_2_points": ceiling_within(ceiling["ixy_paper"], network)} | analysis_device(device))


def remainder_steps_run(run: Run, settings=RemainderSettings(), device=torch.device("cpu"), data_root=None,
                        log=print) -> list[dict]:
    """Seconds per epoch of a pass over every layer point of `run` in each step mode
    (`infopro.remainder_steps`), one row per mode."""
    train, _ = run_splits(run, None, None, device, data_root)
    backbone = place(run.load_net(device).backbone, device)
    with frozen(backbone):
        rows = measure_steps(backbone, train, all_layers(run), settings, log=log)
    return [run.row() | row for row in rows]


def read_ceilings(path) -> pd.DataFrame:
    return read_table(path, "restore it from git, or delete it to measure the ceilings again",
                      ("run_id", "rem_epochs", "ixy_paper", "network_accuracy", "within_2_points"))


def same_budget_but_epochs(table: pd.DataFrame, settings) -> pd.DataFrame:
    """The rows of `table` whose remainder settings equal `settings`' (its `as_columns()`, or a row's rem_*
    columns) in all but the epochs."""
    columns = settings.as_columns() if isinstance(settings, RemainderSettings) else settings
    mask = pd.Series(True, index=table.index)
    for key in RemainderSettings().as_columns():
        if key != "rem_epochs":
            mask &= equal_as_read(table[key], columns[key])
    return table[mask]


# What a ceiling shares with the rows it stands beside: the networks' architecture and recipe (their images)
# and the estimator's settings. It is trained on the image, never on a network's features, so the ceiling
# measured against E2E is also every other method's of that recipe: the fixture's E2E, greedy SL K = 2 and
# InfoPro (Contrast) K = 2 each measured it with 24 epochs, to the digit alike (77.10%).
CEILING_KEYS = ("arch", "recipe", *RemainderSettings().as_columns())


def ceilings_beside(ceilings: pd.DataFrame, like, but_epochs: bool = False) -> pd.DataFrame:
    """The rows of `ceilings` that share every CEILING_KEYS column `like` has (a row or a dict; with `but_epochs`,
    all but the epochs), whichever network each was measured against."""
    for key in CEILING_KEYS:
        if key in like and not (but_epochs and key == "rem_epochs"):
            ceilings = ceilings[equal_as_read(ceilings[key], like[key])]
    return ceilings


def measure_ceilings(run: Run, candidates: list[int], csv_path, settings=RemainderSettings(),
                     device=torch.device("cpu"), data_root=None, log=print, step: str = "eager") -> int | None:
    """Train the ceiling at each candidate number of epochs, shortest first, until one comes within
    2 points of `run`'s own test accuracy; each row is written as soon as it is measured, and rows
    already in `csv_path` are not measured again. Returns the epochs chosen (None: none came close)."""
    csv_path, code = Path(csv_path), analysis_code()
    check_writable(csv_path.parent)
    for epochs in sorted(set(candidates)):
        budget = replace(settings, epochs=epochs)
        table = read_ceilings(csv_path) if csv_path.exists() else pd.DataFrame()
        done = table if table.empty else same_budget_but_epochs(table, budget)
        done = done if done.empty else done[(done["run_id"] == run.run_id) & (done["rem_epochs"] == epochs)]
        if done.empty:
            log(f"{run.run_id}: ceiling with {epochs} epochs")
            done = pd.DataFrame([ceiling_run(run, budget, device, data_root, log, step) | code])
            update_csv(csv_path, read_ceilings, partial(appended, rows=done))
        row = done.iloc[-1]
        within = str(row["within_2_points"]) == "True"
        log(f"{run.run_id}: ceiling {100 * row['ixy_paper']:.2f}% after {epochs} epochs, network "
            f"{100 * row['network_accuracy']:.2f}%: {'within' if within else 'not within'} 2 points")
        if within:
            return epochs
    return None


def recipe_ceiling(run: Run, settings: RemainderSettings, csv_path, device=torch.device("cpu"), data_root=None,
                   log=print, step: str = "eager") -> None:
    """The ceiling with `settings` for `run`'s architecture and recipe, trained against `run` only where
    `csv_path` holds none measured against any network of them (`ceilings_beside`): a budget check of a
    second network then costs its layer points alone."""
    table = read_ceilings(csv_path) if Path(csv_path).exists() else pd.DataFrame()
    same = table if table.empty else ceilings_beside(table, run.row() | settings.as_columns())
    if same.empty:
        measure_ceilings(run, [settings.epochs], csv_path, settings, device, data_root, log, step)
    else:
        log(f"{run.run_id}: its recipe's ceiling with {settings.epochs} epochs is measured "
            f"({100 * same['ixy_paper'].mean():.2f}%, against {', '.join(same['run_id'])})")


def appended(table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    return rows if table.empty else pd.concat([table, rows], ignore_index=True)


def chosen_epochs(csv_path, settings=RemainderSettings(), network: dict | None = None) -> int:
    """The shortest budget (other settings as `settings`) whose ceiling came within 2 points of its
    reference network, as `measure_ceilings` recorded it in `csv_path`; with `network` (the columns a
    ceiling row must match, e.g. a run's `arch` and `recipe`) only ceilings of such a reference count,
    as a budget that suffices against one recipe's network says nothing of another's."""
    if not Path(csv_path).exists():
        raise InfoProError(f"{csv_path} is missing: measure the ceiling first (`python -m analysis.remainder "
                           f"ceiling`), or give --epochs")
    table = read_ceilings(csv_path)
    for column, value in (network or {}).items():
        table = table[equal_as_read(table[column], value)]
    same = table if table.empty else same_budget_but_epochs(table, settings)
    good = same[same["within_2_points"].astype(str) == "True"] if not same.empty else same
    if good.empty:
        against = f" against a network of {', '.join(map(str, network.values()))}" if network else ""
        measured = ", ".join(f"{100 * a:.1f}% after {e} epochs" for a, e in zip(same.get("ixy_paper", []),
                                                                              same.get("rem_epochs", [])))
        raise InfoProError(f"no budget in {csv_path} brought the ceiling within 2 points of its network "
                           f"({measured or 'none measured with these settings' + against}); measure a longer one, "
                           "or give --epochs")
    return int(good["rem_epochs"].min())


KEY_POINTS = "key"  # `layers` of every run: its own `splits.key_layer_points`


def all_layers(run: Run) -> list[int]:
    return list(range(1, num_layer_points(run.config.arch) + 1))


def wanted_layers(run: Run, layers: list[int] | str | None) -> list[int]:
    """`layers` (default: all; KEY_POINTS: layer 1, the run's module ends and its last layer) checked
    against the run's network before any work on it."""
    valid = all_layers(run)
    if layers is None:
        return valid
    if layers == KEY_POINTS:
        return key_layer_points(run.config.arch, run.config.K, run.config.split)
    if outside := sorted(set(layers) - set(valid)):
        raise InfoProError(f"{run.run_id}: layer points must lie in 1..{valid[-1]}, got {outside}")
    return layers


def analyse_runs(runs: list[Run], csv_path, analyse, settings_of, layers=None, *, force: bool = False,
                 log=print) -> pd.DataFrame:
    """Apply `analyse(run, layers) -> rows` to the layers (`wanted_layers`) not yet in the CSV.

    A layer counts as done when the CSV holds its row for the run with `settings_of(run)`;
    `force` redoes them. New rows replace old ones for the same run, settings and layer.
    """
    csv_path, code = Path(csv_path), analysis_code()
    check_writable(csv_path.parent)
    table = read_analysis(csv_path) if csv_path.exists() else pd.DataFrame()
    for run in runs:
        wanted = wanted_layers(run, layers)  # bad layer points are refused whether or not the run has weights
        if not run.has_weights:
            log(f"{run.run_id}: no model.pt, skipped")
            continue
        settings = settings_of(run)
        same = matches(table, run.run_id, settings) if not table.empty else pd.Series(dtype=bool)
        done = set() if force or table.empty else set(table.loc[same, "layer"])
        missing = [layer for layer in wanted if layer not in done]
        if not missing:
            log(f"{run.run_id}: already analysed")
            continue
        log(f"{run.run_id}:")
        rows = pd.DataFrame([row | code for row in analyse(run, missing)])
        table = update_csv(csv_path, read_analysis,
                           partial(replace_rows, rows=rows, run_id=run.run_id, settings=settings))
    return table


def read_analysis(path) -> pd.DataFrame:
    return read_table(path, "restore it from git, or delete it to analyse every run again", ("run_id", "layer"))


def replace_rows(table: pd.DataFrame, rows: pd.DataFrame, run_id: str, settings: dict) -> pd.DataFrame:
    """`table` with `rows` in place of its rows for the same run, settings and layers."""
    if table.empty:
        return rows
    same = matches(table, run_id, settings) & table["layer"].isin(rows["layer"])
    return pd.concat([table[~same], rows], ignore_index=True)


def matches(table: pd.DataFrame, run_id: str, settings: dict) -> pd.Series:
    """Rows of `run_id` made with exactly `settings` (as read back from CSV: `equal_as_read`)."""
    mask = table["run_id"] == run_id
    for key, value in settings.items():
        mask &= equal_as_read(table[key], value) if key in table else False
    return mask
