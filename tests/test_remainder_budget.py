"""The remainder estimator's budget check: some layer points and the ceiling again with a longer budget,
set beside the figure's estimates of the same points (`python -m analysis.remainder budget`,
`make table_remainder_budget`)."""

import pandas as pd
import pytest

from infopro.errors import InfoProError
from infopro.remainder import RemainderSettings
from infopro.remainder_budget import CEILING, budget_means_table, budget_table, check_figure_settings

E2E = dict(run_id="e2e-K1-s0", regime="e2e", task_loss="", K=1, seed=0, epochs=160, recipe="r", arch="resnet32")


def rows(epochs: int, ixy: dict, estimator="remainder", **changed) -> list[dict]:
    """Remainder rows of E2E at the layer points of `ixy` (layer -> I(h,y)), with `epochs` of budget."""
    settings = RemainderSettings(epochs=epochs).as_columns() | changed
    return [E2E | settings | dict(layer=layer, estimator=estimator, ixy_paper=value, ixx_paper=0.44 + epochs / 1e4)
            for layer, value in ixy.items()]


def ceiling(epochs: int, ixy: float) -> dict:
    return E2E | RemainderSettings(epochs=epochs).as_columns() | dict(layer=0, ixy_paper=ixy, network_accuracy=0.8912,
                                                                     within_2_points=True)


FIGURE = rows(30, {1: 0.879, 8: 0.868, 12: 0.8777, 16: 0.8905})


def test_each_point_is_set_beside_the_figures_estimate_with_every_other_setting_equal():
    """Layer 8 at 60 epochs is set beside the figure's 30-epoch estimate, not beside a row made with another batch
    size (nor a 1c2f row); the ceiling comes first, and the caption gives I(h,y)'s span over the points at each."""
    mi = pd.DataFrame(FIGURE + rows(30, {8: 0.5}, rem_batch_size=128) + rows(10, {8: 0.4}, estimator="1c2f"))
    longer = pd.DataFrame(rows(60, {1: 0.887, 8: 0.885, 16: 0.8906}))
    table, caption = budget_table(mi, longer, pd.DataFrame([ceiling(30, 0.8776), ceiling(60, 0.8861)]))
    assert list(table["layer point"]) == [CEILING, 1, 8, 16] and set(table["epochs"]) == {"30 → 60"}
    assert list(table["I(h,y), figure's"]) == ["0.8776", "0.8790", "0.8680", "0.8905"]
    assert list(table["I(h,y) change (points)"]) == ["+0.85", "+0.80", "+1.70", "+0.01"]
    assert list(table["I(h,x), figure's"]) == ["–", "0.4430", "0.4430", "0.4430"]
    assert list(table["I(h,x) change (points)"]) == ["–", "+0.30", "+0.30", "+0.30"]
    assert table["network"].eq("E2E, seed 0, 160 epochs").all()
    assert "(its own test accuracy 0.8912): 2.25 points with 30 epochs, 0.56 with 60" in caption


def test_each_longer_budget_shows_its_own_points_and_spans_only_the_points_estimated_at_it():
    """A third budget run at layer 8 alone adds the ceiling's and layer 8's rows, not dashes for layers 1 and 16,
    and no span (one point has none); one run at layers 1 and 8 spans those two at both budgets (1.10 points at
    30 epochs, where the four figure points span 2.25)."""
    longer = pd.DataFrame(rows(60, {1: 0.887, 8: 0.885, 16: 0.8906}) + rows(120, {8: 0.888})
                          + rows(240, {1: 0.89, 8: 0.889}))
    table, caption = budget_table(pd.DataFrame(FIGURE), longer, None)
    assert list(table["epochs"]) == ["30 → 60"] * 4 + ["30 → 120"] * 2 + ["30 → 240"] * 3
    assert list(table.loc[table["epochs"] == "30 → 120", "layer point"]) == [CEILING, 8]
    assert table.loc[table["epochs"] == "30 → 120", "I(h,y) change (points)"].iloc[1] == "+2.00"
    assert "2.25 points with 30 epochs, 0.56 with 60; E2E, seed 0, 160 epochs: 1.10 points with 30 epochs, 0.10 " \
           "with 240." in caption and "with 120" not in caption


def test_the_recipes_ceiling_stands_beside_every_network_and_its_own_accuracy_only_where_measured():
    """Greedy SL's points get the ceiling measured against E2E of their recipe (the mean of two at 60 epochs),
    not another recipe's; the caption gives a network's own accuracy only from a ceiling measured against it."""
    greedy = dict(run_id="greedy-K2-s0", regime="greedy", K=2)
    mi = pd.DataFrame([row | greedy for row in rows(30, {1: 0.87, 8: 0.84})])
    longer = pd.DataFrame([row | greedy for row in rows(60, {1: 0.88, 8: 0.85})])
    ceilings = pd.DataFrame([ceiling(30, 0.8776), ceiling(60, 0.8860), ceiling(60, 0.8862),
                             ceiling(60, 0.5) | dict(recipe="a CPU fixture")])
    table, caption = budget_table(mi, longer, ceilings)
    assert list(table.iloc[0][["I(h,y), figure's", "I(h,y), longer", "I(h,y) change (points)"]]) == [
        "0.8776", "0.8861", "+0.85"]
    assert "Greedy SL K = 2, seed 0, 160 epochs: 3.00 points" in caption and "own test accuracy" not in caption


def test_a_methods_points_stand_against_e2e_of_its_recipe_and_seed_at_each_budget():
    """Greedy SL seed 0 at layers 1 and 8 is set against E2E seed 0's at both budgets, not seed 1's; at layer 4,
    which E2E did not run, and at the ceiling there is no gap, nor on E2E's own rows."""
    greedy = dict(run_id="greedy-K2-s0", regime="greedy", K=2)
    e2e_s1 = dict(run_id="e2e-K1-s1", seed=1)
    mi = pd.DataFrame(FIGURE + [row | greedy for row in rows(30, {1: 0.87, 4: 0.86, 8: 0.84})]
                      + [row | e2e_s1 for row in rows(30, {1: 0.5, 8: 0.5})])
    longer = pd.DataFrame([row | e2e_s1 for row in rows(60, {1: 0.5, 8: 0.5})] + rows(60, {1: 0.887, 8: 0.885})
                          + [row | greedy for row in rows(60, {1: 0.88, 4: 0.87, 8: 0.85})])
    table, caption = budget_table(mi, longer, pd.DataFrame([ceiling(30, 0.8776), ceiling(60, 0.8861)]))
    gaps = table[table["network"].str.startswith("Greedy")]
    assert list(gaps["I(h,y) − E2E's, figure's (points)"]) == ["–", "-0.90", "–", "-2.80"]
    assert list(gaps["I(h,y) − E2E's, longer (points)"]) == ["–", "-0.70", "–", "-3.50"]
    assert table.loc[table["network"].str.startswith("E2E"), "I(h,y) − E2E's, longer (points)"].eq("–").all()
    assert "against the E2E network of the same recipe and seed" in caption


def seed(number: int, regime="e2e", K=1) -> dict:
    return dict(run_id=f"{regime}-K{K}-s{number}", seed=number, regime=regime, K=K)


def test_over_seeds_each_point_is_the_mean_of_the_seeds_that_ran_it_and_a_gap_needs_every_seeds_e2e():
    """Greedy SL's layer 8 is the mean of seeds 0 and 1 at both budgets, its gap the mean of theirs to E2E's;
    layer 1, which only seed 1 ran at 60 epochs, is seed 1's alone, and has no gap, as E2E seed 1 did not run it
    (a mean over seed 0 alone would stand for both). The recipe's ceiling comes first, once, with no seeds."""
    def of(who: dict, epochs: int, ixy: dict) -> list[dict]:
        return [row | who for row in rows(epochs, ixy)]

    mi = pd.DataFrame(of(seed(0), 30, {1: 0.87, 8: 0.86}) + of(seed(1), 30, {1: 0.88, 8: 0.85})
                      + of(seed(0, "greedy", 2), 30, {8: 0.82}) + of(seed(1, "greedy", 2), 30, {1: 0.86, 8: 0.80}))
    longer = pd.DataFrame(of(seed(0), 60, {8: 0.88}) + of(seed(1), 60, {8: 0.87})
                          + of(seed(0, "greedy", 2), 60, {8: 0.83}) + of(seed(1, "greedy", 2), 60, {1: 0.87, 8: 0.82}))
    table, caption = budget_means_table(mi, longer, pd.DataFrame([ceiling(30, 0.8776), ceiling(60, 0.8861)]))
    assert list(table["configuration"]) == ["the ceiling, 160 epochs", "E2E, 160 epochs", "Greedy SL K = 2, 160 epochs",
                                            "Greedy SL K = 2, 160 epochs"]
    assert list(table["seeds"]) == ["–", "0, 1", "1", "0, 1"] and list(table["layer point"]) == [CEILING, 8, 1, 8]
    assert list(table["I(h,y), figure's"]) == ["0.8776", "0.8550", "0.8600", "0.8100"]
    assert list(table["I(h,y), longer"]) == ["0.8861", "0.8750", "0.8700", "0.8250"]
    assert list(table["I(h,y) − E2E's, figure's (points)"]) == ["–", "–", "–", "-4.50"]
    assert list(table["I(h,y) − E2E's, longer (points)"]) == ["–", "–", "–", "-5.00"]
    assert "the mean of the seeds that ran the check there, where every one of them has the value" in caption


def test_points_the_figure_lacks_read_as_dashes_and_a_check_with_nothing_to_show_is_refused():
    longer = pd.DataFrame(rows(60, {1: 0.887, 2: 0.88}))
    table, _ = budget_table(pd.DataFrame(FIGURE), longer, None)  # layer 2 not in the figure; no ceiling measured
    assert list(table["layer point"]) == [CEILING, 1, 2]
    assert list(table["I(h,y), figure's"]) == ["–", "0.8790", "–"] and list(table["I(h,y), longer"])[0] == "–"
    with pytest.raises(InfoProError, match="no remainder rows of these layer points with the same settings"):
        budget_table(pd.DataFrame(rows(30, {1: 0.879}, rem_lr=0.1)), longer, None)
    for table in (budget_table, budget_means_table):  # a check whose CSV has a header and no rows
        with pytest.raises(InfoProError, match="the budget check holds no rows"):
            table(pd.DataFrame(FIGURE), longer.iloc[:0], None)
        with pytest.raises(InfoProError, match="no point of the budget check was estimated with a longer budget"):
            table(pd.DataFrame(FIGURE), pd.DataFrame(rows(30, {1: 0.879})), None)  # the figure's own budget again


def test_a_check_that_no_figure_row_could_stand_beside_is_refused_before_any_pass_naming_the_rows_settings():
    """The fixture's figure rows were made with batch 128, lr 0.1 and fp32: a check with the GPU's defaults would
    train for nothing (the table sets no row beside them), so it is refused, with the options that match; a
    longer budget with every other setting theirs passes, and a run with no remainder rows is refused."""
    mi = pd.DataFrame(rows(12, {8: 0.70}, rem_batch_size=128, rem_lr=0.1, rem_precision="fp32")
                      + rows(10, {8: 0.4}, estimator="1c2f"))
    with pytest.raises(InfoProError, match="give theirs: --batch-size 128 --lr 0.1 --precision fp32$"):
        check_figure_settings(mi, "e2e-K1-s0", RemainderSettings(epochs=48))
    check_figure_settings(mi, "e2e-K1-s0", RemainderSettings(epochs=48, batch_size=128, lr=0.1, precision="fp32"))
    with pytest.raises(InfoProError, match="greedy-K2-s0 has no remainder rows in the figure"):
        check_figure_settings(mi, "greedy-K2-s0", RemainderSettings(epochs=48))


def test_the_ceiling_of_a_recipe_is_trained_once_whichever_network_asks(tmp_path, monkeypatch):
    """A budget check of greedy SL finds E2E's ceiling of the same recipe and budget and trains none; one of
    another recipe or budget does not count, and the mean of those measured is what it reports."""
    import infopro.analysis as analysis

    class Greedy:
        run_id = "greedy-K2-s0"

        def row(self):
            return E2E | dict(run_id=self.run_id, regime="greedy", K=2)

    trained, said = [], []
    monkeypatch.setattr(analysis, "measure_ceilings", lambda run, candidates, *args, **kwargs: trained.append(
        (run.run_id, candidates)))
    path, longer = tmp_path / "remainder_ceiling.csv", RemainderSettings(epochs=60)
    pd.DataFrame([ceiling(60, 0.8861) | dict(recipe="a CPU fixture"), ceiling(30, 0.8776)]).to_csv(path, index=False)
    analysis.recipe_ceiling(Greedy(), longer, path, log=said.append)
    assert trained == [("greedy-K2-s0", [60])] and said == []
    pd.DataFrame([ceiling(60, 0.8861), ceiling(60, 0.8863)]).to_csv(path, index=False)
    analysis.recipe_ceiling(Greedy(), longer, path, log=said.append)
    assert trained == [("greedy-K2-s0", [60])] and "measured (88.62%, against e2e-K1-s0, e2e-K1-s0)" in said[0]


@pytest.mark.slow  # the command line on a trained network: about 20 s
def test_the_command_estimates_the_ceiling_and_the_points_again_at_twice_the_figures_budget(tmp_path):
    """Without --epochs, `budget` doubles the budget that the ceiling settled for the run's recipe; its ceiling row
    joins the others, its points go to their own CSV, and the table builds from the three files."""
    import shutil

    from conftest import REPO, run_main

    from infopro.config import TrainConfig
    from infopro.figures import build
    from infopro.runs import load_run
    from infopro.train import train

    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / "reference", results / "reference")
    train(TrainConfig(regime="greedy", K=2, dataset="synthetic", epochs=1, train_subset=300, test_subset=100,
                      batch_size=50), results / "runs" / "tiny", device="cpu", log=lambda line: None)
    analysis = results / "analysis"
    analysis.mkdir()
    settings = RemainderSettings(epochs=1, batch_size=50, lr=0.1, precision="fp32")
    pd.DataFrame([load_run(results / "runs" / "tiny").row() | settings.as_columns() | dict(
        layer=0, ixy_paper=0.5, network_accuracy=0.5, within_2_points=True)]).to_csv(
        analysis / "remainder_ceiling.csv", index=False)
    common = ["--runs", str(results / "runs"), "--ceilings", str(analysis / "remainder_ceiling.csv"),
              "--batch-size", "50", "--lr", "0.1", "--precision", "fp32", "--device", "cpu"]
    made = run_main("analysis.remainder", "layers", "--layers", "1,16", *common,
                    "--out", str(analysis / "mutual_information.csv"))
    assert made.returncode == 0, made.stderr
    made = run_main("analysis.remainder", "budget", "--reference", "greedy-K2", "--layers", "1,16", *common,
                    "--out", str(analysis / "remainder_budget.csv"),
                    "--figure", str(analysis / "mutual_information.csv"))
    assert made.returncode == 0, made.stderr
    assert list(pd.read_csv(analysis / "remainder_ceiling.csv")["rem_epochs"]) == [1, 2]
    longer = pd.read_csv(analysis / "remainder_budget.csv")
    assert list(longer["layer"]) == [1, 16] and longer["rem_epochs"].eq(2).all()
    table = pd.read_csv(build("table_remainder_budget", results)[0])
    assert list(table["layer point"]) == [CEILING, "1", "16"] and table["epochs"].eq("1 → 2").all()
    assert table["I(h,y), figure's"].iloc[0] == 0.5 and table["I(h,y), longer"].ne("–").all()
