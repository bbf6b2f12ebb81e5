"""docs/extending.md's example: a local loss registered at run time trains, is named, probed and tabled like
the paper's."""

import pytest

from conftest import REPO, python_block
from infopro import local, style
from infopro.analysis import probe_run
from infopro.config import TrainConfig
from infopro.errors import InfoProError
from infopro.figures import load_reference
from infopro.runs import load_run, runs_table
from infopro.tables import table2
from infopro.train import train


@pytest.fixture
def registries():
    """Put `OBJECTIVES` and `METHODS` back as they were: the example adds to the library's own tables."""
    saved = dict(local.OBJECTIVES), dict(style.METHODS)
    yield
    for table, entries in zip((local.OBJECTIVES, style.METHODS), saved):
        table.clear()
        table.update(entries)


def test_a_local_loss_registered_as_the_docs_say_trains_and_is_probed(registries, tmp_path):
    example = python_block("docs/extending.md")
    with pytest.raises(InfoProError, match="unknown regime 'sim'"):
        TrainConfig(regime="sim", K=4)
    exec(compile(example, "docs/extending.md", "exec"), {})
    config = TrainConfig(regime="sim", K=4, dataset="synthetic", train_subset=1000, test_subset=500, epochs=2,
                         batch_size=32, lr=0.05, warmup_epochs=0)
    assert config.run_id() == "synthetic-resnet32-sim-K4-n1000-e2-b32-s0"
    summary = train(config, tmp_path / "run", device="cpu", log=lambda line: None)
    assert summary["final_test_error"] < 45, summary  # chance is 90%
    run = load_run(tmp_path / "run")
    assert [type(o).__name__ for o in run.load_net().objectives] == ["SimilarityMatching"] * 3
    rows = probe_run(run, run.module_ends, train_subset=500, test_subset=200, log=lambda line: None)
    assert [(row["regime"], row["layer"]) for row in rows] == [("sim", 4), ("sim", 8), ("sim", 12)]
    assert style.local_methods()[-1] == "sim"
    table = table2(runs_table(tmp_path), load_reference(REPO / "results", "table2"))[0].set_index(["method", "K"])
    assert table.loc[("Similarity matching", 4)].iloc[-1] == "–"  # beside the paper's rows, with no paper value
