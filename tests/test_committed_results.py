"""Checks of the committed results and of the docs, run by `make check` (marked `check`, so the
code's tests, `python -m pytest`, leave them out): every table rebuilds to the character, the
README shows the generated tables, every column and link is accounted for, every notebook runs,
`make fig8` works right after set-up, the README's Python example runs on the committed weights, and the
GPU plan agrees with the grid's status."""

import re
import shutil
import subprocess

import nbformat
import pandas as pd
import pytest
import torch
from jupyter_client import KernelManager
from nbclient import NotebookClient

from analysis.readme import pasted, read_tables
from conftest import REPO, python_block, run_main
from infopro.figures import TARGETS, build
from infopro.bench import allocator_calls
from infopro.records import read_json
from infopro.remainder import RemainderSettings, in_paper_units
from infopro.data import load_dataset
from infopro.runs import Run, find_runs, load_run
from infopro.trace import Span, gpu_idle

pytestmark = pytest.mark.check
RESULTS = REPO / "results"


def remainder_step_columns(monkeypatch) -> set[str]:
    """The columns of remainder-steps-<gpu>.csv, from a tiny CPU measurement whose graphed mode fails
    (its row then holds `error`)."""
    import infopro.remainder_steps
    from infopro.data import synthetic_splits
    from infopro.models import CifarResNet

    def refused(module, sample):
        raise RuntimeError("no CUDA graphs on a CPU")

    monkeypatch.setattr(infopro.remainder_steps, "step_graph",
                        lambda step, device, precision: refused if step == "graphed" else None)
    train, _ = synthetic_splits(100, 10)
    rows = infopro.remainder_steps.measure_steps(CifarResNet(8).eval(), train, [4], RemainderSettings(batch_size=50),
                                                 log=lambda line: None)
    return {key for row in rows for key in row}


def test_every_column_the_gpu_only_csvs_will_hold_is_documented(monkeypatch):
    """The idle CSV, the allocator counts, the remainder estimator's rows and its step measurement are
    written on a GPU only, so the test that reads every committed column cannot see them before a
    lease commits them: check their names here."""
    idle = gpu_idle([Span("a", 0, 10, 1), Span("b", 15, 20, 2)], [Span("cudaLaunchKernel", 12, 13, 2)], steps=1)
    names = set(idle) | {"error"} | {f"{key}_in_timed_steps" for key in allocator_calls(torch.device("cpu"))}
    scores = {"accuracy": 0.5, "cross_entropy": 1.0, "bce": 0.6}
    names |= set(in_paper_units(1, scores, 2.3, 0.7, 0.5, 3072)) | set(RemainderSettings().as_columns())
    names |= {"pass_points", "pass_seconds", "pass_step", "network_accuracy", "within_2_points"}
    names |= remainder_step_columns(monkeypatch)
    documented = (RESULTS / "README.md").read_text()
    assert sorted(name for name in names if f"`{name}`" not in documented) == []


def test_the_plan_says_what_the_grid_status_says_is_left_of_the_committed_grid():
    """One command to plan a lease with: each grid stage ends with `grid --status`'s three totals."""
    results = RESULTS
    plan = run_main("experiments.reproduce", "--plan", "--results", str(results))
    assert plan.returncode == 0
    lines = plan.stdout.splitlines()
    for stage, grid in (("table2", "table2-resnet32"), ("dgl", "table2-dgl-resnet32")):
        status = run_main("experiments.grid", grid, "--dataset", "cifar10-jpeg", "--status", "--out", str(results / "runs"))
        first = [n for n, line in enumerate(lines) if line.startswith(f"to do  {stage} ")][0]
        assert status.returncode == 0
        assert [line.strip() for line in lines[first + 1:][:3]] == status.stdout.splitlines()[-3:]


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_builds_from_the_committed_results(target, results_copy):
    paths = build(target, results_copy)
    assert paths and all(path.stat().st_size > 0 for path in paths)


def test_make_fig8_works_right_after_set_up(tmp_path):
    shutil.copytree(RESULTS, tmp_path / "results", ignore=shutil.ignore_patterns("*.pt", "logs", "figures"))
    result = subprocess.run(["make", "fig8", f"RESULTS={tmp_path / 'results'}"], cwd=REPO,
                                          capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "results" / "figures" / "fig8.png").stat().st_size > 10_000


def test_committed_results_are_real_runs_with_provenance():
    runs = find_runs(RESULTS / "runs")
    assert runs, "results/runs holds no finished run"
    for run in runs + find_runs(RESULTS / "schedule-check"):
        provenance = run.record["provenance"]
        assert provenance["git_commit"] not in ("", "unknown") and provenance["git_dirty"] is False
        assert run.record["dataset"]["name"] in ("cifar10", "cifar10-jpeg", "synthetic")
    fixture, everywhere = {run.run_id for run in runs}, {run.run_id for run in find_runs(RESULTS)}
    for name, analysed in (("linear_probe.csv", fixture), ("mutual_information.csv", fixture),
                           ("schedule-check/linear_probe.csv", everywhere),
                           ("schedule-check/mutual_information.csv", everywhere),
                           ("test_predictions.csv", everywhere)):
        rows = pd.read_csv(RESULTS / "analysis" / name)
        assert set(rows["run_id"]) <= analysed, name
        assert not rows["analysis_dirty"].any(), f"{name}: rows made from an uncommitted source tree"


CPU_TRAINED = "-n10000-e12-b128-", "-n10000-e36-b128-"  # the fixture, the schedule check
ANALYSES_OF_WEIGHTS = ("linear_probe.csv", "mutual_information.csv", "schedule-check/linear_probe.csv",
                       "schedule-check/mutual_information.csv")


def scored_networks(results) -> set[str]:
    """The runs table_paired and table_e2e_gap re-scored image by image (the others enter from their
    training's record, `scored_from` summary.json)."""
    predictions = pd.read_csv(results / "analysis" / "test_predictions.csv")
    return set(predictions.loc[predictions["scored_from"] == "model.pt", "run_id"])


def git_output(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def test_the_tracked_weights_are_the_gpu_trained_ones_scored():
    """Only networks a CPU cannot retrain in minutes keep their weights in git's tree: every one of
    them is scored, and every scored network without them is CPU-trained (`make cpu-weights`)."""
    tracked = {line.split("/")[-2] for line in git_output("ls-files", "results/*/model.pt").splitlines()}
    scored = scored_networks(RESULTS)
    assert tracked and tracked <= scored
    assert not [run_id for run_id in tracked if any(tag in run_id for tag in CPU_TRAINED)]
    assert all(any(tag in run_id for tag in CPU_TRAINED) for run_id in scored - tracked), scored - tracked


def test_make_cpu_weights_restores_every_network_an_analysis_read(tmp_path):
    """The CPU-trained weights left the tracked tree; `make cpu-weights` must put back every network
    whose probes, estimates or scores are committed, each the network its run recorded, and leave the
    clone clean (git ignores them)."""
    if git_output("rev-parse", "--is-shallow-repository") != "false":
        pytest.skip("a shallow clone lacks the history that keeps the CPU-trained weights")
    if "true" in git_output("config", "--get-regexp", r"^remote\..*\.promisor$").split():
        # `make cpu-weights` works there (git fetches the old weights from the remote), but a local clone
        # of it cannot reach them, and the checks stay offline.
        pytest.skip("a blob-less clone keeps the CPU-trained weights on its remote, not here")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(clone)], check=True)
    made = subprocess.run(["make", "-s", "cpu-weights"], cwd=clone, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    runs = find_runs(clone / "results")
    analysed = scored_networks(RESULTS) | {run_id for name in ANALYSES_OF_WEIGHTS
                                           for run_id in pd.read_csv(RESULTS / "analysis" / name)["run_id"]}
    assert sorted(run.run_id for run in runs if run.run_id in analysed and not run.has_weights) == []
    assert len([run for run in runs if CPU_TRAINED[0] in run.run_id and run.has_weights]) == 51  # 3 seeds
    next(run for run in runs if CPU_TRAINED[1] in run.run_id).load_net()  # the file holds that run's network
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout
    assert status == ""


def record_names(results) -> set[str]:
    """Every column of the committed record CSVs and every key of the runs' JSON files, a module's
    index written `<k>` (`loss_m3` -> `loss_m<k>`). The tables' human-readable headers are not records."""
    def keys(record: dict):
        for key, value in record.items():
            yield key
            if isinstance(value, dict):
                yield from keys(value)

    csvs = [path for folder in ("analysis", "bench", "reference") for path in (results / folder).rglob("*.csv")]
    csvs += list(results.rglob("metrics.csv"))
    names = {column for path in csvs for column in pd.read_csv(path, nrows=0).columns}
    names |= {key for name in ("config.json", "summary.json", "weights.json") for path in results.rglob(name)
              for key in keys(read_json(path))}
    return {re.sub(r"_m\d+$", "_m<k>", name) for name in names}


def test_every_committed_result_column_is_documented():
    names = record_names(RESULTS)
    assert {"ixx_normalised", "loss_m<k>", "provenance", "final_test_error"} <= names  # the walk reaches every kind
    documented = (RESULTS / "README.md").read_text()
    assert sorted(name for name in names if f"`{name}`" not in documented) == []


def test_committed_tables_are_rebuilt_unchanged_and_the_readme_shows_them(results_copy):
    """No table number is typed by hand: each is what `make` builds from the committed results, and
    the README's copies (the claims and Table 2) are the generated ones to the character."""
    readme = (REPO / "README.md").read_text()
    paper = ("claims", "table2", "table3", "table_schedule", "table_paired", "table_e2e_gap", "table_ranking",
             "table_remainder_budget", "table_remainder_budget_means")
    built = [(target, None) for target in paper] + [("table2", "fixture"), ("claims", "fixture")]
    for target, recipe in built:
        for path in build(target, results_copy, recipe=recipe):
            assert path.read_text() == (RESULTS / "tables" / path.name).read_text(), f"{path.name}: rebuild differs"
    assert pasted(readme, read_tables(RESULTS / "tables")) == readme, "the README's tables are stale: `make readme`"


@pytest.mark.parametrize("claims", ["claims.csv", "claims-fixture.csv"])
def test_every_claim_cites_a_committed_file(claims):
    """A verdict's `from` is where a reader checks it: the figure or table must be there to open."""
    cited = pd.read_csv(RESULTS / "tables" / claims)["from"]
    assert [path for path in cited if not (RESULTS / path).is_file()] == []


def test_the_readme_stays_a_front_page():
    """Under 250 lines, and no commit hashes: provenance lives in the result files."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    assert re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", readme) == []


def layout_names(readme: str) -> set[str]:
    """The file names the README's Layout block gives; `module_parallel(_throughput)` names two."""
    block = readme.split("## Layout", 1)[1].split("```")[1]
    names = set()
    for stem, suffix in re.findall(r"([a-z_]+)(?:\(([a-z_]+)\))?", block):
        names |= {stem, stem + suffix}
    return names


def test_the_readmes_layout_names_every_file_of_the_code():
    """A newcomer finds a file from the layout's one line about it; a new file must get its line."""
    sample = "## Layout\n```\ninfopro/  data, module_parallel(_throughput)  the data\n```"
    assert {"data", "module_parallel", "module_parallel_throughput"} <= layout_names(sample)
    named = layout_names((REPO / "README.md").read_text())
    files = [path for package in ("infopro", "experiments", "analysis") for path in (REPO / package).glob("*.py")]
    assert sorted(f"{path.parent.name}/{path.name}" for path in files
                  if path.stem != "__init__" and path.stem not in named) == []


def test_the_readmes_python_example_runs_on_the_committed_weights(monkeypatch):
    """The README's example loads a committed network and reads its layers; its printed errors are the
    run's record. The test images are synthetic here (the tests never need the dataset), so the example's
    API is what this checks, and the comment's numbers against summary.json."""
    code = python_block("README.md")
    run = load_run(RESULTS / "runs" / re.search(r'load_run\("results/runs/([^"]+)"\)', code).group(1))
    recorded = run.summary["final_test_error"]
    assert f"test error (%): {recorded:.2f} {recorded:.2f}" in code
    monkeypatch.setattr(Run, "load_data", lambda self, data_root=None: load_dataset("synthetic"))
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert sorted(namespace["h"]) == run.module_ends
    x_hat = namespace["x_hat"]
    assert x_hat.shape == (100, 3, 32, 32) and 0 <= x_hat.min() and x_hat.max() <= 1

def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "results/README.md", "results/NOTES.md",
                                  *sorted(str(path.relative_to(REPO)) for path in (REPO / "docs").glob("*.md"))])
def test_every_link_of_the_readmes_leads_somewhere(page):
    """A section renamed or moved, or a figure renamed, would break its links without a word."""
    text = (REPO / page).read_text()
    anchors = {github_anchor(heading) for heading in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    assert [anchor for anchor in re.findall(r"\]\(#([^)]+)\)", text) if anchor not in anchors] == []
    paths = re.findall(r"\]\(([^)#:]+)\)", text)  # files of the repository, not web addresses
    assert [path for path in paths if not (REPO / page).parent.joinpath(path).exists()] == []


@pytest.fixture(scope="module")
def kernel():
    """One Jupyter kernel for every notebook: starting one and importing torch, pandas and matplotlib
    in it took 5 of each notebook's 8 s. Each notebook begins by clearing the names the previous one
    left (`%reset -f`), so one that forgets an import still fails."""
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(REPO / "notebooks"))
    yield manager
    manager.shutdown_kernel(now=True)


@pytest.mark.parametrize("notebook", sorted((REPO / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_execute_headless(notebook, kernel):
    book = nbformat.read(notebook, as_version=4)
    book.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))
    client = NotebookClient(book, km=kernel, timeout=300)
    try:
        client.execute()
    finally:
        client.kc.stop_channels()
    outputs = [o for cell in book.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    if notebook.stem.startswith("fig"):
        assert any("image/png" in o.get("data", {}) for o in outputs)

