"""Whether the remainder estimator's budget sets its values: layer points estimated again with a longer
budget, beside the figure's estimates of them, and the ceiling (the architecture trained on x) at both.

The estimate of I(h,y) is a lower bound that a short budget loosens most for the longest remainders,
those of the early layer points, while the true I(h,y) cannot grow with depth. If E2E's curve rises
where its remainders get short because of the budget alone, a longer budget lifts its early points and
the ceiling towards its last point, a linear classifier on trained features, which stays where it was.
`python -m analysis.remainder budget` makes the rows (results/analysis/remainder_budget.csv),
`make table_remainder_budget` sets them beside the figure's (`budget_table`), and
`make table_remainder_budget_means` gives the same over seeds (`budget_means_table`).
"""

import pandas as pd

from infopro.analysis import ceilings_beside, same_budget_but_epochs
from infopro.errors import InfoProError
from infopro.records import equal_as_read
from infopro.remainder import RemainderSettings
from infopro.selection import with_method
from infopro.style import METHODS

# What two estimates must share to show the budget's effect alone: every setting but the epochs.
SETTINGS_BUT_EPOCHS = tuple(key for key in RemainderSettings().as_columns() if key != "rem_epochs")
CEILING = "x (the ceiling)"


def same_settings_but_epochs(table: pd.DataFrame, like: pd.Series) -> pd.DataFrame:
    """The rows of `table` that share `like`'s run and remainder settings in all but the epochs."""
    return same_budget_but_epochs(table[table["run_id"] == like["run_id"]], like)


def network_points(mi: pd.DataFrame, longer: pd.DataFrame, like: pd.Series) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The layer points `like`'s network ran the check at: (fig10's remainder rows of them, the check's rows),
    every setting equal but the epochs."""
    mine = same_settings_but_epochs(longer, like)
    figure = same_settings_but_epochs(mi[(mi["estimator"] == "remainder") & mi["layer"].isin(mine["layer"])], like)
    if figure.empty:
        raise InfoProError(f"{like['run_id']}: the figure has no remainder rows of these layer points with the "
                           f"same settings but the epochs, to set the longer budget's beside")
    return figure, mine


# The options of `python -m analysis.remainder` that set a remainder setting, to name in a refusal.
SETTING_OPTIONS = {"rem_batch_size": "--batch-size", "rem_lr": "--lr", "rem_precision": "--precision"}


def check_figure_settings(mi: pd.DataFrame, run_id: str, settings: RemainderSettings) -> None:
    """Refuse, before any pass, a check of `run_id` that no fig10 row of it could stand beside: one whose
    `settings` differ from its remainder rows' in more than the epochs (the CPU fixture's rows were made with
    a smaller batch and lr, in fp32), naming the settings those rows have."""
    figure = mi[(mi["run_id"] == run_id) & (mi["estimator"] == "remainder")]
    if figure.empty:
        raise InfoProError(f"{run_id} has no remainder rows in the figure to set a longer budget's beside: "
                           "estimate its layer points first (`python -m analysis.remainder layers`)")
    if same_budget_but_epochs(figure, settings).empty:
        theirs = "; ".join(differences(row, settings) for _, row in figure.drop_duplicates(
            list(SETTINGS_BUT_EPOCHS)).iterrows())
        raise InfoProError(f"{run_id}: its figure rows were estimated with other settings than these, so a longer "
                           f"budget's rows would stand beside none of them; give theirs: {theirs}")


def differences(row: pd.Series, settings: RemainderSettings) -> str:
    """`row`'s remainder settings that `settings` do not share, as the options that set them."""
    wanted = settings.as_columns()
    return " ".join(f"{SETTING_OPTIONS.get(key, key)} {shown_setting(row[key])}" for key in SETTINGS_BUT_EPOCHS
                    if not equal_as_read(pd.Series([row[key]]), wanted[key]).iloc[0])


def shown_setting(value) -> str:
    """A setting as an option takes it: a count read back as float (10.0, beside the 1c2f rows' blanks) as 10."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


# Whom a network's points are set against, to tell whether the budget moves a claim's verdict, not only its
# values: E2E of the same architecture, recipe (its images and schedule) and seed, checked with the same settings.
E2E_KEYS = ("arch", "recipe", "seed")


def e2e_twin(longer: pd.DataFrame, like: pd.Series) -> pd.Series | None:
    """The E2E network of `like`'s E2E_KEYS that ran the check with `like`'s settings but the epochs (None: none
    did, or `like` is E2E)."""
    if like["regime"] == "e2e":
        return None
    twins = longer[longer["regime"] == "e2e"]
    for key in E2E_KEYS:
        twins = twins[equal_as_read(twins[key], like[key])]
    twins = same_budget_but_epochs(twins, like)
    return None if twins.empty else twins.iloc[0]


def method_label(row: pd.Series) -> str:
    K = "" if int(row["K"]) == 1 else f" K = {int(row['K'])}"
    return f"{METHODS[row['method']][0]}{K}"


def network_label(row: pd.Series) -> str:
    """E2E, seed 0, 160 epochs / Greedy SL K = 4, seed 0, 12 epochs: the run's method, seed and schedule
    (the schedule tells the paper's recipe from the CPU fixture)."""
    return f"{method_label(row)}, seed {int(row['seed'])}, {int(row['epochs'])} epochs"


def configuration_label(row: pd.Series) -> str:
    """A network's label without its seed, which its seeds share: Greedy SL K = 4, 12 epochs."""
    return f"{method_label(row)}, {int(row['epochs'])} epochs"


def value(rows: pd.DataFrame, column: str, epochs: int) -> float:
    """`column` of the rows estimated with `epochs`, their mean as fig10 draws a ceiling measured more than
    once (NaN: not estimated, or not by this estimate)."""
    cells = rows.loc[rows["rem_epochs"] == epochs, column] if column in rows else pd.Series(dtype=float)
    return float(cells.mean())


def shown(number: float) -> str:
    return "–" if pd.isna(number) else f"{number:.4f}"


def change(before: float, after: float) -> str:
    return "–" if pd.isna(before) or pd.isna(after) else f"{100 * (after - before):+.2f}"


def span(points: pd.DataFrame, epochs: int) -> str:
    """max − min of I(h,y) over the layer points of `points` estimated with `epochs`, in points."""
    values = points.loc[points["rem_epochs"] == epochs, "ixy_paper"]
    return f"{100 * (values.max() - values.min()):.2f}"


def span_line(label: str, points: pd.DataFrame, base: int, epochs: int) -> str | None:
    """The caption's span of one network at the figure's budget and a longer one, over the layer points
    estimated at both; None where fewer than two were (a single point has no span)."""
    layers = set(points.loc[points["rem_epochs"] == epochs, "layer"])
    if len(layers) < 2:
        return None
    both = points[points["layer"].isin(layers)]
    return f"{label}: {span(both, base)} points with {base} epochs, {span(both, epochs)} with {epochs}"


def recipe_ceiling(ceilings: pd.DataFrame | None, like: pd.Series) -> pd.DataFrame:
    """The ceiling rows of `like`'s recipe at every budget (none where no ceiling was measured)."""
    if ceilings is None:
        return pd.DataFrame(columns=["run_id", "rem_epochs", "ixy_paper", "network_accuracy"])
    return ceilings_beside(ceilings, like, but_epochs=True)


# The values `budget_points` gives each point: I(h,y), I(h,x) and E2E's I(h,y), at the figure's budget and a longer.
VALUES = [(name, budget) for name in ("ixy", "ixx", "e2e") for budget in ("base", "longer")]


def budget_points(mi: pd.DataFrame, longer: pd.DataFrame,
                  ceilings: pd.DataFrame | None) -> tuple[pd.DataFrame, list[str]]:
    """Per network of `longer` (remainder_budget.csv), longer budget and layer point (the ceiling's first):
    I(h,y) and I(h,x) at the figure's budget (the epochs of `mi`'s remainder rows of that network with the
    same other settings) and the longer one, and E2E's I(h,y) there (NaN: not estimated). Returns (those
    rows, the caption's span of each network)."""
    if longer.empty:
        raise InfoProError("the budget check holds no rows: make them with `python -m analysis.remainder budget`")
    longer = with_method(longer)
    rows, spans = [], []
    for _, like in longer.drop_duplicates(["run_id", *SETTINGS_BUT_EPOCHS]).iterrows():
        figure, mine = network_points(mi, longer, like)
        base, points = int(figure["rem_epochs"].min()), pd.concat([figure, mine])
        twin = e2e_twin(longer, like)
        e2e = pd.concat(network_points(mi, longer, twin)) if twin is not None else points.iloc[:0]
        ceiling = recipe_ceiling(ceilings, like)
        own = ceiling.loc[ceiling["run_id"] == like["run_id"], "network_accuracy"].dropna()
        label = network_label(like) + ("" if own.empty  # where a ceiling was measured against it
                                       else f" (its own test accuracy {float(own.iloc[-1]):.4f})")
        for epochs in sorted(int(epochs) for epochs in set(mine["rem_epochs"]) - {base}):
            for point, at, e2e_at in [(CEILING, ceiling, ceiling.iloc[:0])] + [
                    (layer, points[points["layer"] == layer], e2e[e2e["layer"] == layer])
                    for layer in sorted(mine.loc[mine["rem_epochs"] == epochs, "layer"].unique())]:
                estimates = {"ixy": (at, "ixy_paper"), "ixx": (at, "ixx_paper"), "e2e": (e2e_at, "ixy_paper")}
                recipes = point == CEILING  # the recipe's ceiling, which its networks share, not one network's
                rows.append({"network": network_label(like), "layer point": point, "base": base, "longer": epochs,
                             "configuration": f"the ceiling, {int(like['epochs'])} epochs" if recipes
                             else configuration_label(like), "seed": None if recipes else int(like["seed"])} | {
                    f"{name}_{budget}": value(*estimates[name], {"base": base, "longer": epochs}[budget])
                    for name, budget in VALUES})
            spans.append(span_line(label, points, base, epochs))
    if not rows:
        raise InfoProError("no point of the budget check was estimated with a longer budget than its figure rows")
    return pd.DataFrame(rows), [line for line in spans if line is not None]


def shown_points(points: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """`points` (as `budget_points` makes them, or their means) as the tables show them, after `labels`."""
    return pd.DataFrame({
        **{label: points[label] for label in labels},
        "layer point": points["layer point"],
        "epochs": [f"{base} → {epochs}" for base, epochs in zip(points["base"], points["longer"])],
        "I(h,y), figure's": points["ixy_base"].map(shown), "I(h,y), longer": points["ixy_longer"].map(shown),
        "I(h,y) change (points)": list(map(change, points["ixy_base"], points["ixy_longer"])),
        "I(h,x), figure's": points["ixx_base"].map(shown), "I(h,x), longer": points["ixx_longer"].map(shown),
        "I(h,x) change (points)": list(map(change, points["ixx_base"], points["ixx_longer"])),
        "I(h,y) − E2E's, figure's (points)": list(map(change, points["e2e_base"], points["ixy_base"])),
        "I(h,y) − E2E's, longer (points)": list(map(change, points["e2e_longer"], points["ixy_longer"]))})


def caption_body(whose: str) -> str:
    return (f"I(h,y) (test accuracy of the remainder) and I(h,x) (1 − decoder BCE) in the paper's units at some "
            f"layer points of {whose} fig10 rows (figure's) and longer ones, every other setting equal; the ceiling "
            "is the architecture trained on the image itself, which every network of a recipe shares (the mean of "
            "those measured; no I(h,x)). I(h,y) − E2E's: against the E2E network of the same recipe and seed at the "
            "same layer point and budget, where it ran the check.")


def budget_table(mi: pd.DataFrame, longer: pd.DataFrame, ceilings: pd.DataFrame | None) -> tuple[pd.DataFrame, str]:
    """Per network of `longer` and layer point (`budget_points`): I(h,y) and I(h,x) at the figure's budget
    and each longer one, with the change in points and the gap to E2E's. Returns (table, caption)."""
    points, spans = budget_points(mi, longer, ceilings)
    caption = ("The remainder estimator's budget: " + caption_body("a network, with the budget of its")
               + " I(h,y)'s span (max − min) over the layer points estimated at both budgets: " + "; ".join(spans)
               + ".")
    return shown_points(points, ["network"]), caption


def budget_means_table(mi: pd.DataFrame, longer: pd.DataFrame,
                       ceilings: pd.DataFrame | None) -> tuple[pd.DataFrame, str]:
    """`budget_table` over seeds: per configuration, layer point and longer budget, the mean of the seeds that
    ran the check there, shown only where every one of them has the value (a mean over some of them would
    stand for all); in the order of `budget_table`, each recipe's ceiling, shown once per budget, ahead of its
    networks. Returns (table, caption)."""
    points, _ = budget_points(mi, longer, ceilings)
    groups = points.groupby(["configuration", "layer point", "base", "longer"], sort=False)
    means = groups[[f"{name}_{budget}" for name, budget in VALUES]].agg(
        lambda column: column.mean(skipna=False)).reset_index()
    means.insert(1, "seeds", groups["seed"].agg(
        lambda seeds: ", ".join(str(int(seed)) for seed in sorted(set(seeds.dropna()))) or "–").to_numpy())
    first_seen = {name: rank for rank, name in enumerate(dict.fromkeys(points["configuration"]))}
    order = pd.DataFrame({"configuration": means["configuration"].map(first_seen), "longer": means["longer"],
                          "layer": means["layer point"].map(lambda point: 0 if point == CEILING else point)})
    means = means.loc[order.sort_values(list(order), kind="stable").index]
    caption = ("The remainder estimator's budget over seeds: " + caption_body(
        "a configuration's networks (the mean of the seeds that ran the check there, where every one of them has "
        "the value; – : where one lacks it), with the budget of their") + " Per network: table_remainder_budget.")
    return shown_points(means, ["configuration", "seeds"]), caption
