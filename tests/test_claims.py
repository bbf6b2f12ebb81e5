"""The claims table: each verdict follows its stated rule, and turns when the results do."""

import pandas as pd
import pytest

from infopro.claims import (PAPER_KS, greedy_grows_with_k, infopro_recovers_the_gap, label_information,
                            memory_at_time, paper_ordering, recovered, separability, verdict)

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


def layer_rows(value: str, curves: dict, estimator: str | None = None) -> pd.DataFrame:
    """Analysis rows: {(regime, K): [value at layer 1..16]}."""
    rows = []
    for (regime, K), values in curves.items():
        for layer, v in enumerate(values, start=1):
            rows.append(PAPER_RECIPE | {"run_id": f"{regime}-{K}", "regime": regime, "K": K, "seed": 0,
                                        "layer": layer, value: v} | ({"estimator": estimator} if estimator else {}))
    return pd.DataFrame(rows)


def test_separability_compares_greedy_and_e2e_where_the_first_module_ends():
    e2e = [60.0 - 3 * layer for layer in range(16)]
    greedy = {("greedy", K): [20.0] * 15 + [10.0] for K in PAPER_KS}
    probes = layer_rows("test_error", {("e2e", 1): e2e, **greedy})
    reference = layer_rows("value", {("e2e", 1): e2e, **greedy}).assign(quantity="linear_probe_test_error")
    assert separability(probes, reference, early=True)["verdict"] == "holds"
    assert separability(probes, reference, early=False)["verdict"] == "does not hold"  # E2E ends at 15 > 10
    assert "K = 4 (layer 4): 20.0 vs 51.0" in separability(probes, reference, early=True)["ours"]


def test_label_information_is_pending_without_the_remainder_estimator_and_judged_with_it():
    reference = layer_rows("value", {("e2e", 1): [0.93] * 16, ("greedy", 4): [0.9] * 16}).assign(
        quantity="ixy_paper_units")
    small_head = layer_rows("ixy_normalised", {("e2e", 1): [0.5] * 16}, "1c2f")
    assert label_information(small_head, reference)["verdict"].startswith("pending")
    curves = {("e2e", 1): [0.90] * 16, **{("greedy", K): [0.85] * 16 for K in PAPER_KS}}
    level = layer_rows("ixy_paper", curves, "remainder")
    assert label_information(level, reference)["verdict"] == "holds"
    rising = layer_rows("ixy_paper", {**curves, ("e2e", 1): [0.2 + 0.05 * layer for layer in range(16)]},
                        "remainder")
    assert label_information(rising, reference)["verdict"].startswith("E2E not level")


def test_infopro_star_must_save_a_third_of_the_memory_in_less_time_than_checkpointing():
    bench = pd.DataFrame({"method": ["checkpoint", "infopro-balanced:2", "infopro-balanced:4"],
                          "peak_allocated_bytes_vs_e2e": [0.3, 0.55, 0.4], "step_seconds_vs_e2e": [1.12, 1.04, 1.14]})
    reference = pd.DataFrame({"arch": "resnet110", "dataset": "cifar10", "method": ["checkpoint", "infopro-balanced"],
                              "K": [1, 2], "memory_change_pct": [-58.4, -42.8], "overhead_wall_pct": [27.5, 1.1]})
    row = memory_at_time(bench, "peak_allocated_bytes", reference)
    assert row["verdict"] == "partly (K = 2)"  # K = 4 takes longer than checkpointing here
    assert "K = 2: -45% memory, +4.0% time" in row["ours"] and "K = 2: -43% memory, +1.1% time" in row["paper"]
