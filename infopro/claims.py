"""The paper's claims this repository tests, each with the paper's numbers, ours and a verdict.

One row per claim, computed from the same result files as the figures and tables (the paper's
recipe, `selection.figure_rows`): the README's claims table is this table, so a verdict changes only
when a result does. A verdict is `holds`, `partly` (holds at some K only), `does not hold`, or
`pending` with what is missing. Every rule is stated in the claim's `test` column.
"""

import pandas as pd

from infopro.selection import (ANALYSIS_FIGURE_ARCH, PAPER_RANKING, default_estimator, figure_rows,
                               seeds_at_every_point, with_method)
from infopro.splits import key_layer_points, module_ends, num_layer_points
from infopro.style import METHODS

PAPER_KS = (2, 4, 8, 16)
HOLDS, PARTLY, FAILS = "holds", "partly", "does not hold"


def listing(values: dict, digits: int = 2, unit: str = "") -> str:
    """{K: value} as "K = 2: 14.39, 4: 20.00" ("–" where a value is missing)."""
    shown = [f"{K}: {value:.{digits}f}{unit}" for K, value in values.items() if pd.notna(value)]
    return ("K = " + ", ".join(shown)) if shown else "–"


def verdict(checks: dict) -> str:
    """`holds` if every K checked holds, `partly` if some do (naming them), else `does not hold`."""
    passed = [K for K, ok in checks.items() if ok]
    if not checks:
        return "pending: no run"
    if len(passed) == len(checks):
        return HOLDS
    return f"{PARTLY} (K = {', '.join(map(str, passed))})" if passed else FAILS


def mean_errors(runs: pd.DataFrame) -> dict:
    """(method, K) -> mean final test error over seeds, of the paper's recipe."""
    rows = figure_rows(runs)[0]
    return rows.groupby(["method", "K"])["final_test_error"].mean().to_dict()


def paper_errors(reference: pd.DataFrame, arch: str = "resnet32") -> dict:
    rows = with_method(reference[(reference["arch"] == arch) & (reference["dataset"] == "cifar10")])
    return rows.set_index(["method", "K"])["error_mean"].astype(float).to_dict()


def of(errors: dict, method: str) -> dict:
    """{K: error} of `method` at the paper's K."""
    return {K: errors.get((method, K)) for K in PAPER_KS}


def greedy_grows_with_k(ours: dict, paper: dict) -> dict:
    def text(errors):
        return f"E2E {errors.get(('e2e', 1), float('nan')):.2f}; " + listing(of(errors, "greedy"))
    greedy = [ours.get(("e2e", 1))] + list(of(ours, "greedy").values())
    known = [value for value in greedy if value is not None]
    grows = len(known) == len(greedy) and all(a < b for a, b in zip(known, known[1:]))
    return {"claim": "Greedy SL's test error grows with K", "paper": text(paper), "ours": text(ours),
            "verdict": HOLDS if grows else FAILS if len(known) == len(greedy) else "pending: missing runs",
            "test": "E2E < K = 2 < 4 < 8 < 16 (test error %, mean over seeds)", "from": "tables/table2.md"}


def recovered(errors: dict, method: str) -> dict:
    """{K: share of greedy SL's gap to E2E that `method` closes}, in %."""
    e2e = errors.get(("e2e", 1))
    shares = {}
    for K in PAPER_KS:
        greedy, ours = errors.get(("greedy", K)), errors.get((method, K))
        if None not in (e2e, greedy, ours):
            shares[K] = 100 * (greedy - ours) / (greedy - e2e)
    return shares


def infopro_recovers_the_gap(ours: dict, paper: dict, method: str) -> dict:
    shares = recovered(ours, method)
    return {"claim": f"{METHODS[method][0]} recovers most of greedy SL's gap to E2E",
            "paper": listing(recovered(paper, method), 0, "%"), "ours": listing(shares, 0, "%"),
            "verdict": verdict({K: share > 50 for K, share in shares.items()}),
            "test": "(greedy − InfoPro) / (greedy − E2E) > 50% at each K", "from": "tables/table2.md"}


def ordering(errors: dict, K: int) -> list[str]:
    """The paper's locally supervised methods with a run at K, best first."""
    present = [m for m in PAPER_RANKING if errors.get((m, K)) is not None]
    return sorted(present, key=lambda m: errors[(m, K)])


def in_order(errors: dict) -> tuple[dict, dict]:
    """{K: whether the mean errors run InfoPro (Contrast) < (Softmax) < DGL < greedy SL} at each K where all
    four have a run, and {K: the methods without a run there} at the others."""
    checks, missing = {}, {}
    for K in PAPER_KS:
        order = ordering(errors, K)
        if absent := [method for method in PAPER_RANKING if method not in order]:
            missing[K] = absent
        else:
            checks[K] = order == list(PAPER_RANKING)
    return checks, missing


def order_text(errors: dict) -> str:
    return "; ".join(f"K = {K}: " + " < ".join(METHODS[m][0].replace("InfoPro ", "") for m in ordering(errors, K))
                     for K in PAPER_KS)


def paper_ordering(ours: dict, paper: dict) -> dict:
    checks, missing = in_order(ours)
    paper_checks, _ = in_order(paper)
    paper_verdict = verdict(paper_checks)
    return {"claim": "Test error: InfoPro (Contrast) < InfoPro (Softmax) < DGL < greedy SL at each K",
            "paper": "in that order at every K" if paper_verdict == HOLDS else order_text(paper),
            "ours": order_text(ours), "verdict": pending_text(missing, checks) if missing else verdict(checks),
            "test": "the four methods' mean test errors in that order at each K", "from": "tables/table2.md"}


def pending_text(missing: dict, checks: dict) -> str:
    """Which methods lack a run at which K, and the verdict so far at the K where all four have one."""
    absent = {method for methods in missing.values() for method in methods}
    names = ", ".join(METHODS[m][0] for m in PAPER_RANKING if m in absent)
    so_far = f"; at K = {', '.join(map(str, checks))}: {verdict(checks)}" if checks else ""
    return f"pending: no {names} run at K = {', '.join(map(str, missing))}{so_far}"


def first_module_end(K: int) -> int:
    """The layer point where the first local module of the analysis figure's network ends (paper split)."""
    return module_ends(ANALYSIS_FIGURE_ARCH, K)[0]


def matched_curves(rows: pd.DataFrame, networks: list, value: str) -> pd.DataFrame:
    """layer -> the mean `value` of each (method, K) of `networks`, a column each, over the seeds that all of
    them have at that layer: a difference between two methods is then never one between seed sets (the
    CPU fixture reads its third seed at some layer points only). Layer points they share no seed at are left out."""
    own = rows[pd.MultiIndex.from_arrays([rows["method"], rows["K"]]).isin(networks)]
    own = own if "seed" in own else own.assign(seed=0)  # the paper's read-off values: one curve per network
    table = own.pivot_table(index=["layer", "seed"], columns=["method", "K"], values=value, aggfunc="mean")
    return table.reindex(columns=pd.MultiIndex.from_tuples(networks)).dropna().groupby(level="layer").mean()


def compared(rows: pd.DataFrame, value: str, layer_of, better, digits: int = 3) -> tuple[str, dict]:
    """Greedy SL against E2E at layer_of(K), over the seeds both have there: the text "greedy vs E2E" per K,
    and {K: better(greedy, e2e)}."""
    pairs = {}
    for K in PAPER_KS:
        both = matched_curves(rows, [("greedy", K), ("e2e", 1)], value)
        if layer_of(K) in both.index:
            pairs[K] = tuple(both.loc[layer_of(K)])
    text = "; ".join(f"K = {K} (layer {layer_of(K)}): {greedy:.{digits}f} vs {e2e:.{digits}f}"
                     for K, (greedy, e2e) in pairs.items())
    return text or "–", {K: better(greedy, e2e) for K, (greedy, e2e) in pairs.items()}


def below(greedy: float, e2e: float) -> bool:
    return greedy < e2e


def paper_curves(reference: pd.DataFrame, quantity: str) -> pd.DataFrame:
    rows = reference[reference["quantity"] == quantity]
    return rows.assign(method=rows["regime"], value=rows["value"].astype(float))


def separability(probes: pd.DataFrame, reference: pd.DataFrame, early: bool) -> dict:
    """Greedy SL's first module more separable than E2E there (early), or E2E's last layer more
    separable than greedy SL's (not early)."""
    rows = with_method(figure_rows(probes)[0])
    paper = paper_curves(reference, "linear_probe_test_error")
    layer_of = first_module_end if early else (lambda K: 16)
    better = below if early else (lambda greedy, e2e: e2e < greedy)
    ours, checks = compared(rows, "test_error", layer_of, better, digits=1)
    theirs, _ = compared(paper, "value", layer_of, better, digits=1)
    claim = ("Greedy SL's first module is more linearly separable than E2E's layers there" if early else
             "E2E's last layer is more linearly separable than greedy SL's")
    return {"claim": claim, "paper": theirs, "ours": ours, "verdict": verdict(checks),
            "test": "linear-probe test error %, greedy SL vs E2E at " +
                    ("the first module end" if early else "layer 16"), "from": "figures/fig8.png"}


def input_lost_early(mi: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """Greedy SL keeps less of the input than E2E at its first module end, in the units of the
    estimator figures show by default (`selection.default_estimator`)."""
    estimator = default_estimator(mi)
    rows = with_method(figure_rows(mi[mi["estimator"] == estimator])[0])
    remainder = estimator == "remainder"
    value = "ixx_paper" if remainder else "ixx_normalised"
    ours, checks = compared(rows, value, first_module_end, below)
    theirs, _ = compared(paper_curves(reference, "ixx_paper_units"), "value", first_module_end, below)
    unit = "1 − decoder BCE (remainder estimator)" if remainder else "normalised Î(h,x), 1c2f estimator"
    return {"claim": "Greedy SL loses I(h,x) in its first module", "paper": theirs, "ours": ours,
            "verdict": verdict(checks), "test": f"I(h,x), greedy SL vs E2E at the first module end ({unit})",
            "from": "figures/fig10.png"}


# I(h,y) counts as level, or kept, within 0.02 of test accuracy: the paper's E2E curve spans 0.012
# from layer 1 to 16, and the estimator's ceiling sits within 2 points of E2E's own accuracy.
IXY_LEVEL = 0.02
INFOPRO = ("infopro-contrast", "infopro-softmax")
IXY_UNITS = "test accuracy of the remainder"


def remainder_rows(mi: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The remainder estimator's rows of the paper's recipe (I(h,y) in the paper's units, `ixy_paper`;
    none before a GPU ran it), and the network they are of."""
    rows = with_method(figure_rows(mi)[0])  # of one network: the figures' (`selection.main_recipe`)
    remainder = rows[rows["estimator"] == "remainder"]
    arch = rows["arch"].iloc[0]
    return (remainder if "ixy_paper" in remainder else remainder.assign(ixy_paper=float("nan"))), arch


def curve(rows: pd.DataFrame, method: str, K: int, value: str = "ixy_paper") -> pd.Series:
    """layer -> the mean `value` of (method, K) at the layer points it has, over the seeds read at every one
    of them, as the figures draw it: a span across depth is then never one across seed sets (the paper's
    read-off values have no seeds)."""
    own = rows[(rows["method"] == method) & (rows["K"] == K)]
    own = seeds_at_every_point(own, value) if "seed" in own else own
    return own.groupby("layer")[value].mean().dropna()


def span(values: pd.Series) -> str:
    return f"{values.min():.3f} to {values.max():.3f}" if len(values) else "–"


def missing_points(rows: pd.DataFrame, networks, arch: str) -> str:
    """What keeps an I(h,y) claim pending ("" once every network has remainder rows at its key layer
    points, `splits.key_layer_points`): a network's points arrive over several GPU calls."""
    found = {}
    for method, K in networks:
        key = key_layer_points(arch, K)
        found[(method, K)] = (len(set(curve(rows, method, K).index) & set(key)), len(key))
    if not any(count for count, _ in found.values()):
        return "the remainder estimator has not run on these networks yet (a GPU stage, docs/analysis.md)"
    short = {}
    for (method, K), (count, of) in found.items():
        if count < of:
            short.setdefault(method, []).append(f"{count} of {of}" if method == "e2e" else f"{K}: {count} of {of}")
    parts = [METHODS[method][0] + (" " if method == "e2e" else " K = ") + ", ".join(counts)
             for method, counts in short.items()]
    return ("remainder layer points so far (of layer 1, the module ends and the last; E2E: every layer): "
            + "; ".join(parts)) if parts else ""


def pending_points(missing: str, checks: dict) -> str:
    so_far = f"; at K = {', '.join(map(str, checks))}: {verdict(checks)}" if checks else ""
    return f"pending: {missing}{so_far}"


def e2e_keeps_label_information(mi: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """E2E's I(h,y) level across depth."""
    rows, arch = remainder_rows(mi)
    ours, missing = curve(rows, "e2e", 1), missing_points(rows, [("e2e", 1)], arch)
    level = HOLDS if ours.max() - ours.min() <= IXY_LEVEL else FAILS
    return {"claim": "E2E keeps I(h,y) level across depth",
            "paper": f"E2E {span(curve(paper_curves(reference, 'ixy_paper_units'), 'e2e', 1, 'value'))}",
            "ours": f"E2E {span(ours)}" if len(ours) else "–",
            "verdict": pending_points(missing, {}) if missing else level,
            "test": f"E2E's I(h,y) within {IXY_LEVEL} from layer 1 to {num_layer_points(arch)} ({IXY_UNITS})",
            "from": "figures/fig10.png"}


def greedy_below_e2e(rows: pd.DataFrame, value: str, arch: str) -> dict:
    """{K: greedy SL's `value` below E2E's at its first module end and every layer point after it that
    greedy SL has}, at the K where both have every key layer point from the first module end on."""
    checks = {}
    for K in PAPER_KS:
        both, first = matched_curves(rows, [("greedy", K), ("e2e", 1)], value), first_module_end(K)
        if all(layer in both.index for layer in key_layer_points(arch, K) if layer >= first):
            after = both[both.index >= first]
            checks[K] = bool((after[("greedy", K)] < after[("e2e", 1)]).all())
    return checks


def greedy_loses_label_information(mi: pd.DataFrame, reference: pd.DataFrame) -> dict:
    """Greedy SL's I(h,y) falls below E2E's in its first module and stays below."""
    rows, arch = remainder_rows(mi)
    ours, _ = compared(rows, "ixy_paper", first_module_end, below)
    theirs, _ = compared(paper_curves(reference, "ixy_paper_units"), "value", first_module_end, below)
    checks = greedy_below_e2e(rows, "ixy_paper", arch)
    missing = missing_points(rows, [("e2e", 1)] + [("greedy", K) for K in PAPER_KS], arch)
    return {"claim": "Greedy SL loses I(h,y) in its first module and never regains it", "paper": theirs,
            "ours": ours, "verdict": pending_points(missing, checks) if missing else verdict(checks),
            "test": f"I(h,y), greedy SL below E2E at the first module end and every later layer point estimated, "
                    f"each later module end included ({IXY_UNITS})",
            "from": "figures/fig10.png"}


def infopro_keeps_label_information(mi: pd.DataFrame) -> dict:
    """InfoPro's I(h,y) at its first module end within IXY_LEVEL of E2E's there, and above greedy SL's."""
    rows, arch = remainder_rows(mi)
    checks, shown = {}, []
    for K in PAPER_KS:
        layer = first_module_end(K)
        read = [m for m in INFOPRO if layer in curve(rows, m, K).index]
        both = matched_curves(rows, [("e2e", 1), ("greedy", K)] + [(m, K) for m in read], "ixy_paper")
        if not read or layer not in both.index:
            continue
        e2e, greedy, *infopro = both.loc[layer]
        values = dict(zip(read, infopro))
        if len(values) == len(INFOPRO):  # judged once both task terms are read; shown as they come
            checks[K] = all(abs(value - e2e) <= IXY_LEVEL and value > greedy for value in values.values())
        shown.append(f"K = {K} (layer {layer}): " + ", ".join(
            f"{METHODS[m][0].replace('InfoPro ', '')} {value:.3f}" for m, value in values.items()) +
            f" vs E2E {e2e:.3f}, greedy SL {greedy:.3f}")
    networks = [("e2e", 1)] + [(method, K) for method in ("greedy", *INFOPRO) for K in PAPER_KS]
    missing = missing_points(rows, networks, arch)
    return {"claim": "InfoPro keeps I(h,y) through its first module",
            "paper": "not plotted (the case for InfoPro's loss)", "ours": "; ".join(shown) or "–",
            "verdict": pending_points(missing, checks) if missing else verdict(checks),
            "test": f"I(h,y) of InfoPro (Contrast) and (Softmax) within {IXY_LEVEL} of E2E's and above greedy SL's "
                    f"at the first module end ({IXY_UNITS})", "from": "figures/fig10.png"}


# Table 3 belongs to no recipe (the memory benchmark trains nothing): every recipe's claims point at the same one.
TABLE3 = "tables/table3.md"


def memory_at_time(bench: pd.DataFrame, memory: str, reference: pd.DataFrame) -> dict:
    """InfoPro* at K = 2 and 4 cuts memory by a third or more at under 15% extra time, less time than
    checkpointing costs."""
    measured = bench.set_index("method")
    paper = reference[(reference["arch"] == "resnet110") & (reference["dataset"] == "cifar10")]
    paper = {("checkpoint" if m == "checkpoint" else f"{m}:{K}"): row for m, K, (_, row)
             in zip(paper["method"], paper["K"], paper.iterrows())}

    def ours(method):
        row = measured.loc[method]
        return 100 * (row[f"{memory}_vs_e2e"] - 1), 100 * (row["step_seconds_vs_e2e"] - 1)

    methods = [m for m in ("infopro-balanced:2", "infopro-balanced:4", "checkpoint") if m in measured.index]
    checkpoint_time = ours("checkpoint")[1] if "checkpoint" in measured.index else float("inf")
    checks = {}
    for method in methods[:-1] if "checkpoint" in methods else methods:
        memory_change, time = ours(method)
        checks[int(method[-1])] = memory_change <= -33 and time < min(15, checkpoint_time)

    def text(values):
        return "; ".join(f"{name.replace('infopro-balanced:', 'K = ')}: {mem:+.0f}% memory, {time:+.1f}% time"
                         for name, (mem, time) in values.items())
    return {"claim": "InfoPro* cuts memory at a small time cost, less than gradient checkpointing's",
            "paper": text({m: (float(paper[m]["memory_change_pct"]), float(paper[m]["overhead_wall_pct"]))
                           for m in methods if m in paper}),
            "ours": text({m: ours(m) for m in methods}), "verdict": verdict(checks),
            "test": "ResNet-110, batch 1024: memory ≤ −33% and time < +15% vs E2E, and less time than checkpointing",
            "from": TABLE3}


def claims(runs: pd.DataFrame, probes: pd.DataFrame, mi: pd.DataFrame, bench: pd.DataFrame, memory: str,
           table2_reference: pd.DataFrame, analysis_reference: pd.DataFrame,
           table3_reference: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The claims table and its caption."""
    ours, paper = mean_errors(runs), paper_errors(table2_reference)
    rows = [greedy_grows_with_k(ours, paper),
            infopro_recovers_the_gap(ours, paper, "infopro-contrast"),
            infopro_recovers_the_gap(ours, paper, "infopro-softmax"),
            paper_ordering(ours, paper),
            separability(probes, analysis_reference, early=True),
            separability(probes, analysis_reference, early=False),
            input_lost_early(mi, analysis_reference),
            e2e_keeps_label_information(mi, analysis_reference),
            greedy_loses_label_information(mi, analysis_reference),
            infopro_keeps_label_information(mi),
            memory_at_time(bench, memory, table3_reference)]
    recipe = figure_rows(runs)[1]
    caption = (f"The paper's claims and our verdicts: ResNet-32 ({recipe}; means over the seeds of Table 2) beside "
               "the paper's CIFAR-10 values (Tables 2 and 3, and its analysis figure read off); memory and time: "
               "ResNet-110, batch 1024, Table 3's GPU. `from`: the file under results/ that shows it.")
    return pd.DataFrame(rows, columns=["claim", "paper", "ours", "verdict", "test", "from"]), caption


def of_recipe(table: pd.DataFrame, slug: str) -> pd.DataFrame:
    """The claims table of a recipe other than the shown default (`make claims RECIPE=fixture`): each row's
    `from` names that recipe's figure or table, <target>-<slug>, as `make <target> RECIPE=...` writes it."""
    def of_slug(path: str) -> str:
        stem, _, suffix = path.rpartition(".")
        return path if path == TABLE3 else f"{stem}-{slug}.{suffix}"
    return table.assign(**{"from": table["from"].map(of_slug)})
