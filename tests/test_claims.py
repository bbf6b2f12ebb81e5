"""The claims table: each verdict follows its stated rule, and turns when the results do."""

import pandas as pd
import pytest

from infopro.claims import (IXY_LEVEL, PAPER_KS, e2e_keeps_label_information, first_module_end, greedy_below_e2e,
                            greedy_grows_with_k, greedy_loses_label_information, infopro_keeps_label_information,
                            infopro_recovers_the_gap, input_lost_early, memory_at_time, paper_curves, paper_ordering,
                            recovered, separability, verdict)
from infopro.selection import default_estimator, with_method
from infopro.splits import key_layer_points

PAPER_RECIPE = dict(arch="resnet32", split="paper", recipe="paper", epochs=160, train_images=50000, task_loss="")


def errors(e2e=10.0, greedy=(14.0, 20.0, 24.0, 26.0), contrast=(11.0, 12.0, 15.0, 16.0), dgl=None,
           softmax=(11.5, 13.0, 15.5, 17.0)) -> dict:
    table = {("e2e", 1): e2e}
    for method, values in (("greedy", greedy), ("infopro-contrast", contrast), ("infopro-softmax", softmax),
                           ("dgl", dgl)):
        for K, value in zip(PAPER_KS, values or ()):
            table[(method, K)] = value
    return table


def test_verdicts_name_the_k_where_a_claim_holds():
    assert verdict({2: True, 4: True}) == "holds"
    assert verdict({2: True, 4: False, 8: True}) == "partly (K = 2, 8)"
    assert verdict({2: False}) == "does not hold"


def test_greedy_error_must_grow_with_k_from_e2e_on():
    assert greedy_grows_with_k(errors(), errors())["verdict"] == "holds"
    flat = errors(greedy=(14.0, 20.0, 19.0, 26.0))
    assert greedy_grows_with_k(flat, errors())["verdict"] == "does not hold"


def test_the_share_of_the_gap_infopro_closes():
    shares = recovered(errors(), "infopro-contrast")
    assert shares[2] == pytest.approx(75.0) and shares[16] == pytest.approx(62.5)
    weak = errors(contrast=(11.0, 18.0, 15.0, 16.0))  # K = 4 closes 20% of the gap
    assert infopro_recovers_the_gap(weak, errors(), "infopro-contrast")["verdict"] == "partly (K = 2, 8, 16)"


def test_the_papers_ordering_waits_for_dgl_then_is_judged_per_k():
    assert paper_ordering(errors(), errors())["verdict"] == "pending: no DGL run at K = 2, 4, 8, 16"
    first = errors(dgl=(12.0, None, None, None))  # DGL at K = 2 only, between Softmax and greedy SL there
    assert paper_ordering(first, errors())["verdict"] == "pending: no DGL run at K = 4, 8, 16; at K = 2: holds"
    with_dgl = errors(dgl=(12.0, 14.0, 18.0, 30.0))  # worse than greedy SL at K = 16
    row = paper_ordering(with_dgl, with_dgl)
    assert row["verdict"] == "partly (K = 2, 4, 8)" and "K = 16: (Contrast) < (Softmax) < Greedy SL < DGL" in row["ours"]


def layer_rows(value: str, curves: dict, estimator: str | None = None, seed: int = 0) -> pd.DataFrame:
    """Analysis rows: {(method, K): [value at layer 1..n]}, a method being a regime or "infopro-<task loss>"."""
    rows = []
    for (method, K), values in curves.items():
        regime, _, task_loss = method.partition("-")
        for layer, v in enumerate(values, start=1):
            rows.append(PAPER_RECIPE | {"run_id": f"{method}-{K}", "regime": regime, "task_loss": task_loss, "K": K,
                                        "seed": seed, "layer": layer, value: v}
                        | ({"estimator": estimator} if estimator else {}))
    return pd.DataFrame(rows)


def test_separability_compares_greedy_and_e2e_where_the_first_module_ends():
    e2e = [60.0 - 3 * layer for layer in range(16)]
    greedy = {("greedy", K): [20.0] * 15 + [10.0] for K in PAPER_KS}
    probes = layer_rows("test_error", {("e2e", 1): e2e, **greedy})
    reference = layer_rows("value", {("e2e", 1): e2e, **greedy}).assign(quantity="linear_probe_test_error")
    assert separability(probes, reference, early=True)["verdict"] == "holds"
    assert separability(probes, reference, early=False)["verdict"] == "does not hold"  # E2E ends at 15 > 10
    assert "K = 4 (layer 4): 20.0 vs 51.0" in separability(probes, reference, early=True)["ours"]


IXY_REFERENCE = layer_rows("value", {("e2e", 1): [0.93] * 16, ("greedy", 4): [0.9] * 16}).assign(
    quantity="ixy_paper_units")
SMALL_HEAD = layer_rows("ixy_normalised", {("e2e", 1): [0.5] * 16, **{("greedy", K): [0.4] * 16 for K in PAPER_KS}},
                        "1c2f").pipe(lambda rows: rows.assign(ixx_normalised=(rows["regime"] == "e2e") * 0.5 + 0.3))


def with_remainder(curves: dict) -> pd.DataFrame:
    """The mutual-information CSV: 1c2f rows of every network, remainder rows of `curves`."""
    return pd.concat([SMALL_HEAD, layer_rows("ixy_paper", curves, "remainder")], ignore_index=True)


def test_the_label_information_claims_wait_for_every_layer_point_of_the_remainder_estimator():
    for claim in (e2e_keeps_label_information(SMALL_HEAD, IXY_REFERENCE),
                  greedy_loses_label_information(SMALL_HEAD, IXY_REFERENCE),
                  infopro_keeps_label_information(SMALL_HEAD)):
        assert claim["verdict"].startswith("pending: the remainder estimator has not run") and claim["ours"] == "–"
    so_far = "pending: remainder layer points so far (of layer 1, the module ends and the last; E2E: every layer): "
    first_points = with_remainder({("e2e", 1): [0.9] * 5})  # a GPU call's worth of E2E's points, layer 1 first
    assert e2e_keeps_label_information(first_points, IXY_REFERENCE)["verdict"] == so_far + "E2E 5 of 16"
    assert greedy_loses_label_information(first_points, IXY_REFERENCE)["verdict"] == \
        so_far + "E2E 5 of 16; Greedy SL K = 2: 0 of 3, 4: 0 of 5, 8: 0 of 9, 16: 0 of 16"
    alone = layer_rows("ixy_paper", {("e2e", 1): [0.9] * 5}, "remainder")  # no 1c2f row to count the points by
    assert e2e_keeps_label_information(alone, IXY_REFERENCE)["verdict"] == so_far + "E2E 5 of 16"
    between = with_remainder({("e2e", 1): [0.9] * 16, ("greedy", 2): [0.85] * 7})  # layers 1 to 7: one key point
    assert greedy_loses_label_information(between, IXY_REFERENCE)["verdict"] == \
        so_far + "Greedy SL K = 2: 1 of 3, 4: 0 of 5, 8: 0 of 9, 16: 0 of 16"


def test_e2e_must_stay_within_two_points_across_depth():
    assert e2e_keeps_label_information(with_remainder({("e2e", 1): [0.90] * 15 + [0.915]}),
                                       IXY_REFERENCE)["verdict"] == "holds"
    rising = with_remainder({("e2e", 1): [0.2 + 0.05 * layer for layer in range(16)]})
    row = e2e_keeps_label_information(rising, IXY_REFERENCE)
    assert row["verdict"] == "does not hold" and row["ours"] == "E2E 0.200 to 0.950"
    assert row["paper"] == "E2E 0.930 to 0.930"


def test_greedy_must_stay_below_e2e_from_its_first_module_end_on():
    e2e = {("e2e", 1): [0.90] * 16}
    below = {("greedy", K): [0.95] * (first_module_end(K) - 1) + [0.85] * (17 - first_module_end(K)) for K in PAPER_KS}
    assert greedy_loses_label_information(with_remainder(e2e | below), IXY_REFERENCE)["verdict"] == "holds"
    regained = below | {("greedy", 2): [0.85] * 15 + [0.91]}  # back above E2E at layer 16
    row = greedy_loses_label_information(with_remainder(e2e | regained), IXY_REFERENCE)
    assert row["verdict"] == "partly (K = 4, 8, 16)" and "K = 2 (layer 8): 0.850 vs 0.900" in row["ours"]


def test_greedy_is_judged_at_its_key_points_and_at_every_point_between_them_estimated():
    """Layer 1, the module ends and layer 16 decide the claim (E2E at every layer); a point between
    module ends that is estimated counts too."""
    def key_points(K, value):
        rows = layer_rows("ixy_paper", {("greedy", K): [value] * 16}, "remainder")
        return rows[rows["layer"].isin(key_layer_points("resnet32", K))]

    e2e = layer_rows("ixy_paper", {("e2e", 1): [0.90] * 16}, "remainder")
    key_only = with_method(pd.concat([e2e] + [key_points(K, 0.85) for K in PAPER_KS]))
    assert greedy_below_e2e(key_only, "ixy_paper", "resnet32") == {K: True for K in PAPER_KS}
    assert greedy_loses_label_information(pd.concat([SMALL_HEAD, key_only]), IXY_REFERENCE)["verdict"] == "holds"
    regained = pd.concat([key_only, with_method(layer_rows("ixy_paper", {("greedy", 4): [0.85] * 9 + [0.95]},
                                                           "remainder")).query("layer == 10")])  # between 8 and 12
    assert greedy_below_e2e(regained, "ixy_paper", "resnet32") == {2: True, 4: False, 8: True, 16: True}
    no_end = key_only[~((key_only["K"] == 8) & (key_only["layer"] == 6))]  # a module end of K = 8 missing
    assert 8 not in greedy_below_e2e(no_end, "ixy_paper", "resnet32")


def test_methods_are_compared_over_the_seeds_both_have_at_a_layer_point():
    """A third seed read for E2E alone (here far lower) moves no comparison with a network it is not read for,
    and a seed read at some layer points only does not make E2E's curve uneven."""
    curves = {("e2e", 1): [0.90] * 16, **{(method, K): [value] * 16 for K in PAPER_KS
                                          for method, value in [("greedy", 0.85), ("infopro-contrast", 0.89),
                                                                ("infopro-softmax", 0.89)]}}
    seeds = pd.concat([with_remainder(curves), layer_rows("ixy_paper", curves, "remainder", seed=1)])
    low_e2e = layer_rows("ixy_paper", {("e2e", 1): [0.60] * 8}, "remainder", seed=2).query("layer in [1, 2, 4, 8]")
    rows = pd.concat([seeds, low_e2e], ignore_index=True)
    greedy = greedy_loses_label_information(rows, IXY_REFERENCE)
    assert greedy["verdict"] == "holds" and "K = 2 (layer 8): 0.850 vs 0.900" in greedy["ours"]
    assert infopro_keeps_label_information(rows)["verdict"] == "holds"
    assert e2e_keeps_label_information(rows, IXY_REFERENCE)["ours"] == "E2E 0.900 to 0.900"
    with_greedy = pd.concat([rows, layer_rows("ixy_paper", {("greedy", 2): [0.55] * 8}, "remainder", seed=2)])
    assert "K = 2 (layer 8): 0.750 vs 0.800" in greedy_loses_label_information(with_greedy, IXY_REFERENCE)["ours"]


def test_infopro_must_stay_near_e2e_and_above_greedy_at_its_first_module_end():
    curves = {("e2e", 1): [0.90] * 16, **{("greedy", K): [0.80] * 16 for K in PAPER_KS},
              **{(method, K): [0.89] * 16 for method in ("infopro-contrast", "infopro-softmax") for K in PAPER_KS}}
    row = infopro_keeps_label_information(with_remainder(curves))
    assert row["verdict"] == "holds"
    assert "K = 4 (layer 4): (Contrast) 0.890, (Softmax) 0.890 vs E2E 0.900, greedy SL 0.800" in row["ours"]
    lost = curves | {("infopro-softmax", 8): [0.85] * 16}  # 0.05 below E2E at layer 2
    assert infopro_keeps_label_information(with_remainder(lost))["verdict"] == "partly (K = 2, 4, 16)"


def test_infopro_is_shown_as_its_networks_come_and_judged_at_a_k_once_both_task_terms_are_read():
    curves = {("e2e", 1): [0.90] * 16, **{("greedy", K): [0.80] * 16 for K in PAPER_KS},
              ("infopro-contrast", 2): [0.89] * 16}
    row = infopro_keeps_label_information(with_remainder(curves))
    assert row["ours"] == "K = 2 (layer 8): (Contrast) 0.890 vs E2E 0.900, greedy SL 0.800"
    assert row["verdict"].startswith("pending: ") and "; at K =" not in row["verdict"]
    row = infopro_keeps_label_information(with_remainder(curves | {("infopro-softmax", 2): [0.85] * 16}))
    assert row["verdict"].endswith("; at K = 2: does not hold") and "(Softmax) 0.850" in row["ours"]


def test_the_label_information_rules_hold_on_the_papers_own_values():
    """A rule the paper's read-off curves fail would test something the paper does not claim."""
    from conftest import REPO

    reference = pd.read_csv(REPO / "results" / "reference" / "analysis_figure.csv")
    paper = paper_curves(reference, "ixy_paper_units")
    assert greedy_below_e2e(paper, "value", "resnet32") == {K: True for K in PAPER_KS}
    e2e = paper[paper["method"] == "e2e"]["value"]
    assert e2e.max() - e2e.min() <= IXY_LEVEL


def test_fig10_and_the_input_claim_switch_to_the_remainder_once_it_covers_the_papers_figure():
    greedy = {("greedy", K): [0.8] * 16 for K in PAPER_KS}
    partial = with_remainder({("e2e", 1): [0.9] * 16, **greedy, ("greedy", 16): [0.8] * 5})
    assert default_estimator(partial) == "1c2f"
    first_points = layer_rows("ixy_paper", {network: [0.8] * 5 for network in [("e2e", 1), *greedy]}, "remainder")
    assert default_estimator(first_points) == "1c2f"  # 5 of a ResNet-32's 16 points, though no 1c2f row says so
    assert "1c2f estimator" in input_lost_early(partial, IXY_REFERENCE)["test"]
    complete = pd.concat([partial, layer_rows("ixy_paper", {("greedy", 16): [0.8] * 16}, "remainder")])
    complete = complete.drop_duplicates(["run_id", "estimator", "layer"], keep="last").assign(ixx_paper=0.4)
    assert default_estimator(complete) == "remainder"
    assert "remainder estimator" in input_lost_early(complete, IXY_REFERENCE)["test"]
    between = (complete["estimator"] == "remainder") & (complete["K"] == 2) & ~complete["layer"].isin([1, 8, 16])
    assert default_estimator(complete[~between]) == "remainder"  # greedy SL K = 2 at layers 1, 8 and 16 only
    no_e2e_point = (complete["estimator"] == "remainder") & (complete["K"] == 1) & (complete["layer"] == 9)
    assert default_estimator(complete[~no_e2e_point]) == "1c2f"  # E2E is the reference at every layer


def test_a_shorter_recipes_remainder_rows_leave_the_shown_recipe_as_it_is():
    """A CPU fixture covered by the remainder estimator switches its own figure, not the paper recipe's."""
    from infopro.figures import RowPicker

    curves = {("e2e", 1): [0.9] * 16, **{("greedy", K): [0.8] * 16 for K in PAPER_KS}}
    fixture = layer_rows("ixy_paper", curves, "remainder").assign(recipe="12 epochs, batch 128", epochs=12,
                                                                  train_images=10000, ixx_paper=0.4)
    mi = pd.concat([SMALL_HEAD, fixture], ignore_index=True)
    assert default_estimator(mi) == "1c2f"
    assert "1c2f estimator" in input_lost_early(mi, IXY_REFERENCE)["test"]
    assert set(RowPicker()(mi)["estimator"]) == {"1c2f"}
    assert set(RowPicker("fixture")(mi)["estimator"]) == {"remainder"}


def test_infopro_star_must_save_a_third_of_the_memory_in_less_time_than_checkpointing():
    bench = pd.DataFrame({"method": ["checkpoint", "infopro-balanced:2", "infopro-balanced:4"],
                          "peak_allocated_bytes_vs_e2e": [0.3, 0.55, 0.4], "step_seconds_vs_e2e": [1.12, 1.04, 1.14]})
    reference = pd.DataFrame({"arch": "resnet110", "dataset": "cifar10", "method": ["checkpoint", "infopro-balanced"],
                              "K": [1, 2], "memory_change_pct": [-58.4, -42.8], "overhead_wall_pct": [27.5, 1.1]})
    row = memory_at_time(bench, "peak_allocated_bytes", reference)
    assert row["verdict"] == "partly (K = 2)"  # K = 4 takes longer than checkpointing here
    assert "K = 2: -45% memory, +4.0% time" in row["ours"] and "K = 2: -43% memory, +1.1% time" in row["paper"]
