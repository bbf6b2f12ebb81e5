"""The paper's tables from result files: built as DataFrames, written as CSV, Markdown and LaTeX.

Table 2 puts our final-epoch test error (mean ± std over n seeds, n shown) beside the
paper's value for each method and K, with the difference. Numbers come only from run
summaries under results/ and from results/reference/ (the paper's values, with a source).
"""

import math
from pathlib import Path

import pandas as pd

from infopro.plots import METHODS, main_recipe, with_method
from infopro.records import atomic_write


def mean_std(mean: float, std: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    spread = "" if std is None or (isinstance(std, float) and math.isnan(std)) else f" ± {std:.2f}"
    return f"{mean:.2f}{spread}"


def table2(runs: pd.DataFrame, reference: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Rows per (method, K): ours (mean ± std, n) beside the paper's; returns (table, caption)."""
    runs, recipe = main_recipe(with_method(runs))
    arch = runs["arch"].iloc[0]
    ours = runs.groupby(["method", "K"])["final_test_error"].agg(["mean", "std", "count"]).reset_index()
    paper = with_method(reference[(reference["arch"] == arch) & (reference["dataset"] == "cifar10")])
    merged = ours.merge(paper[["method", "K", "error_mean", "error_std"]], on=["method", "K"], how="left")
    order = {method: i for i, method in enumerate(METHODS)}
    merged = merged.sort_values(["method", "K"], key=lambda c: c.map(order) if c.name == "method" else c)
    table = pd.DataFrame({
        "method": [METHODS[m][0] for m in merged["method"]],
        "K": merged["K"],
        "ours: test error (%)": [mean_std(m, s) for m, s in zip(merged["mean"], merged["std"])],
        "n": merged["count"],
        "paper: test error (%)": [mean_std(m, s) for m, s in zip(merged["error_mean"], merged["error_std"])],
        "ours − paper": [f"{a - b:+.2f}" if not math.isnan(b) else "–"
                         for a, b in zip(merged["mean"], merged["error_mean"].astype(float))],
    })
    caption = (f"Table 2, {arch}: final-epoch test error, ours ({recipe}; mean ± std over n seeds) "
               f"beside the paper's (cifar10, 160 epochs, batch 1024, mean ± std over 5 seeds).")
    return table.reset_index(drop=True), caption


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
