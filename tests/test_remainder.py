"""The remainder estimator of I(h,y) and I(h,x) checked on cases whose answer is known.

A small ResNet-8 (layer points 1..4) on synthetic images with some labels redrawn at random,
so that no estimate sits at 100% and a difference between points can show.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from infopro.augment import to_unit
from infopro.data import Split, synthetic_splits
from infopro.device import prepare_input
from infopro.errors import InfoProError
from infopro.models import CifarResNet
from infopro.probes import probe_layers
from infopro.remainder import RemainderSettings, ceiling_within, estimate

FAST = RemainderSettings(epochs=4, batch_size=50, lr=0.1, warmup_epochs=0, precision="fp32")
CHANCE = 0.1


def with_label_noise(split: Split, fraction: float, seed: int) -> Split:
    generator = torch.Generator().manual_seed(seed)
    labels = split.labels.clone()
    redraw = torch.rand(len(labels), generator=generator) < fraction
    labels[redraw] = torch.randint(0, 10, (int(redraw.sum()),), generator=generator)
    return Split(split.images, labels)


@pytest.fixture(scope="module")
def data():
    train, test = synthetic_splits(1000, 500)
    return with_label_noise(train, 0.3, 1), with_label_noise(test, 0.3, 2)


def trained_resnet8(train: Split, epochs: int = 3) -> CifarResNet:
    """A ResNet-8 trained end to end for a few epochs, in eval mode."""
    torch.manual_seed(0)
    net = CifarResNet(8)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        for index in torch.randperm(len(train)).split(50):
            optimizer.zero_grad()
            x = prepare_input(to_unit(train.images[index]), torch.device("cpu"))
            F.cross_entropy(net(x), train.labels[index]).backward()
            optimizer.step()
    return net.eval()


def by_layer(rows):
    return {row["layer"]: row for row in rows}


class Zeros(nn.Module):
    """A layer that destroys its input: the label cannot be read after it."""

    def forward(self, h):
        return torch.zeros_like(h)


class Orthogonal(nn.Module):
    """An invertible layer: a fixed random rotation of the channels."""

    def __init__(self, channels: int):
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(channels, channels, generator=torch.Generator().manual_seed(3)))
        self.register_buffer("q", q)

    def forward(self, h):
        return torch.einsum("dc,nchw->ndhw", self.q, h)


class Embed(nn.Module):
    """The image itself, zero-padded to the stem's 16 channels: invertible, so h_1 holds all of x."""

    def forward(self, x):
        return F.pad(x, (0, 0, 0, 0, 0, 13))


@pytest.mark.slow  # 14 s (three points); the ceiling test below checks a known level quickly
def test_a_layer_that_destroys_the_label_gives_chance_there_and_after(data):
    train, test = data
    torch.manual_seed(0)
    net = CifarResNet(8).eval()
    net.layers[1] = Zeros()
    rows = by_layer(estimate(net, train, test, [1, 2, 4], FAST, log=lambda line: None))
    assert rows[1]["ixy_paper"] > 3 * CHANCE
    for point in (2, 4):
        assert rows[point]["ixy_paper"] == pytest.approx(CHANCE, abs=0.05)
        assert abs(rows[point]["ixy_nats"]) < 0.05


def test_at_the_last_point_it_agrees_with_the_linear_probe(data):
    train, test = data
    net = trained_resnet8(train)
    remainder = by_layer(estimate(net, train, test, [4], FAST, log=lambda line: None))[4]["ixy_paper"]
    probe = 1 - probe_layers(net, train, test, [4])[0]["test_error"] / 100
    assert remainder > 3 * CHANCE
    assert remainder == pytest.approx(probe, abs=0.05)


@pytest.mark.slow  # 10 s; the ceiling test below also checks that an invertible layer keeps the level
def test_it_stays_level_along_invertible_layers(data):
    train, test = data
    torch.manual_seed(0)
    net = CifarResNet(8).eval()
    net.layers[1] = Orthogonal(16)
    rows = by_layer(estimate(net, train, test, [1, 2], FAST, log=lambda line: None))
    assert rows[1]["ixy_paper"] > 3 * CHANCE
    assert rows[2]["ixy_paper"] == pytest.approx(rows[1]["ixy_paper"], abs=0.06)


def test_the_image_itself_reaches_the_ceiling(data):
    train, test = data
    torch.manual_seed(0)
    net = CifarResNet(8).eval()
    net.layers[0] = Embed()
    rows = by_layer(estimate(net, train, test, [0, 1], FAST, log=lambda line: None))
    assert rows[0]["ixy_paper"] > 3 * CHANCE
    assert rows[1]["ixy_paper"] == pytest.approx(rows[0]["ixy_paper"], abs=0.06)
    assert "ixx_paper" not in rows[0] and 0 < rows[1]["ixx_normalised"] <= 1


def test_a_point_does_not_depend_on_the_points_trained_beside_it(data):
    train, test = data
    torch.manual_seed(0)
    net = CifarResNet(8).eval()
    settings = RemainderSettings(epochs=1, batch_size=100, lr=0.1, warmup_epochs=0, precision="fp32")
    alone = by_layer(estimate(net, train, test, [3], settings, log=lambda line: None))[3]
    together = by_layer(estimate(net, train, test, [0, 1, 3], settings, log=lambda line: None))[3]
    assert (alone.pop("pass_points"), together.pop("pass_points")) == (1, 3)  # and what the pass cost
    assert alone.pop("pass_seconds") > 0 and together.pop("pass_seconds") > 0
    assert alone.pop("pass_step") == together.pop("pass_step") == "eager"
    assert together == pytest.approx(alone, rel=1e-5)


def test_the_graphed_step_captures_whole_batches_and_trains_the_same_numbers(data):
    """CUDA graphs replay the kernels they captured, so what is checked here is the rest: each point is
    captured once, on a whole batch, the last smaller batch of an epoch runs eagerly, and the capture's
    warm-up iterations leave no trace (BatchNorm's running statistics and the gradients)."""
    from infopro.probes import frozen
    from infopro.remainder import train_estimators

    train = Split(data[0].images[:130], data[0].labels[:130])  # batches of 50, 50 and 30
    settings = RemainderSettings(epochs=2, batch_size=50, lr=0.1, warmup_epochs=0, precision="fp32")
    torch.manual_seed(0)
    net = CifarResNet(8).eval()
    captures = []

    def warm_up_only(module, sample):  # what a capture does besides capturing: warm-up steps on the sample
        captures.append(len(sample[0]))
        for _ in range(3):
            module(*sample).backward()
        return module

    with frozen(net):
        eager = train_estimators(net, train, [0, 2, 4], settings, log=lambda line: None)
        graphed = train_estimators(net, train, [0, 2, 4], settings, log=lambda line: None, graph=warm_up_only)
    assert captures == [50, 50, 50]
    assert graphed.epoch_losses == eager.epoch_losses
    for name, value in eager.state_dict().items():
        assert torch.equal(graphed.state_dict()[name], value), name


def test_the_graphed_step_needs_a_gpu_and_a_known_name(data):
    train, test = data
    with pytest.raises(InfoProError, match="replays CUDA graphs; this pass runs on cpu"):
        estimate(CifarResNet(8), train, test, [1], FAST, step="graphed")
    with pytest.raises(InfoProError, match="unknown remainder step 'fused'"):
        estimate(CifarResNet(8), train, test, [1], FAST, step="fused")


def test_the_step_measurement_times_each_mode_and_uses_only_one_that_agrees(data, monkeypatch):
    import pandas as pd

    import infopro.remainder_steps
    from infopro.remainder_steps import fastest_step, measure_steps

    def refused(module, sample):  # a capture this device refuses
        raise RuntimeError("capture refused\nthe rest of the message")

    monkeypatch.setattr(infopro.remainder_steps, "step_graph",
                        lambda step, device, precision: refused if step == "graphed" else None)
    train = data[0]
    rows = measure_steps(CifarResNet(8).eval(), train, [1, 4], RemainderSettings(batch_size=100, precision="fp32"),
                         log=lambda line: None)
    failed, eager = rows
    assert failed["step"] == "graphed" and failed["error"] == "RuntimeError: capture refused"
    assert eager["agrees_with_eager"] and eager["measured_images"] == len(train) and eager["points"] == 2
    assert eager["epoch_seconds"] > 0 and eager["loss_epoch1"] > 0 and fastest_step(pd.DataFrame(rows)) == "eager"
    table = pd.DataFrame([dict(step="eager", epoch_seconds=10.0, agrees_with_eager=True),
                          dict(step="graphed", epoch_seconds=4.0, agrees_with_eager=True)])
    assert fastest_step(table) == "graphed"
    assert fastest_step(table.assign(agrees_with_eager=[True, False])) == "eager"


def test_the_frozen_network_is_unchanged(data):
    train, test = data
    torch.manual_seed(0)
    net = CifarResNet(8).train()  # a forward in train mode would move BN's running statistics
    before = {name: value.clone() for name, value in net.state_dict().items()}
    settings = RemainderSettings(epochs=1, batch_size=100, lr=0.1, warmup_epochs=0, precision="fp32")
    estimate(net, train, test, [2], settings, log=lambda line: None)
    assert net.training
    for name, value in net.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("change", [dict(epochs=0), dict(batch_size=1), dict(lr=0.0), dict(precision="fp16")])
def test_bad_settings_are_refused(change):
    with pytest.raises(InfoProError):
        RemainderSettings(**change)


def test_points_outside_the_network_are_refused(data):
    train, test = data
    with pytest.raises(InfoProError, match="0..4"):
        estimate(CifarResNet(8), train, test, [5], FAST)


def test_the_budget_check_reads_percentage_points():
    assert ceiling_within(0.875, 0.889)
    assert not ceiling_within(0.86, 0.889)


def test_a_network_takes_the_budget_settled_against_its_own_recipe(tmp_path):
    """A ceiling that reached a short CPU fixture's E2E says nothing of what the paper recipe's E2E needs."""
    import pandas as pd

    from infopro.analysis import chosen_epochs

    def ceiling(recipe, epochs, within):
        return RemainderSettings(epochs=epochs).as_columns() | dict(
            run_id=f"e2e-{recipe}", arch="resnet32", recipe=recipe, ixy_paper=0.8, network_accuracy=0.81,
            within_2_points=within)

    path = tmp_path / "remainder_ceiling.csv"
    pd.DataFrame([ceiling("fixture", 12, True), ceiling("paper", 20, False), ceiling("paper", 30, True)]).to_csv(
        path, index=False)
    assert chosen_epochs(path) == 12  # any reference
    assert chosen_epochs(path, network={"arch": "resnet32", "recipe": "paper"}) == 30
    assert chosen_epochs(path, network={"arch": "resnet32", "recipe": "fixture"}) == 12
    with pytest.raises(InfoProError, match="none measured with these settings against a network of resnet110, paper"):
        chosen_epochs(path, network={"arch": "resnet110", "recipe": "paper"})


def test_layers_refuse_a_run_whose_recipe_has_no_ceiling_before_any_pass(tmp_path):
    """A passing ceiling of another recipe does not settle the budget of this run's: one line, no row."""
    import pandas as pd
    from conftest import run_main

    from infopro.config import TrainConfig
    from infopro.train import train

    train(TrainConfig(regime="greedy", K=2, dataset="synthetic", epochs=1, train_subset=100, test_subset=50,
                      batch_size=50), tmp_path / "runs" / "tiny", device="cpu", log=lambda line: None)
    ceilings = tmp_path / "remainder_ceiling.csv"
    pd.DataFrame([RemainderSettings(epochs=2).as_columns() | dict(
        run_id="e2e-elsewhere", arch="resnet32", recipe="another recipe", ixy_paper=0.8, network_accuracy=0.8,
        within_2_points=True)]).to_csv(ceilings, index=False)
    refused = run_main("analysis.remainder", "layers", "--runs", str(tmp_path / "runs"), "--ceilings", str(ceilings),
                       "--out", str(tmp_path / "mi.csv"), "--device", "cpu")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "none measured with these settings against a network of resnet32, synthetic" in refused.stderr
    assert not (tmp_path / "mi.csv").exists()
    (tmp_path / "runs" / "tiny" / "model.pt").unlink()  # a run without weights is skipped: it needs no budget
    skipped = run_main("analysis.remainder", "layers", "--runs", str(tmp_path / "runs"), "--ceilings", str(ceilings),
                       "--out", str(tmp_path / "mi.csv"), "--device", "cpu")
    assert skipped.returncode == 0 and "no model.pt, skipped" in skipped.stdout


@pytest.mark.slow  # the whole command line on a trained network: 13 s
def test_the_command_measures_the_ceiling_then_every_layer_and_fig10_draws_them(tmp_path):
    """`ceiling` writes its rows and stops at the first candidate within 2 points; `layers` takes that
    budget, writes remainder rows beside the 1c2f ones and skips them when called again; fig10 and the
    information plane draw either estimator's rows (1c2f's by default: the remainder's cover three
    layer points of one network, not the paper's figure)."""
    import shutil

    import pandas as pd
    from conftest import REPO, run_main

    from infopro.analysis import chosen_epochs
    from infopro.config import TrainConfig
    from infopro.figures import build
    from infopro.train import train

    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / "reference", results / "reference")
    train(TrainConfig(regime="greedy", K=2, dataset="synthetic", epochs=1, train_subset=300, test_subset=100,
                      batch_size=50), results / "runs" / "tiny", device="cpu", log=lambda line: None)
    common = ["--runs", str(results / "runs"), "--ceilings", str(results / "analysis" / "remainder_ceiling.csv"),
              "--batch-size", "50", "--lr", "0.1", "--precision", "fp32", "--device", "cpu"]
    ceiling = run_main("analysis.remainder", "ceiling", "--reference", "greedy-K2", "--candidates", "1", "2", *common)
    ceilings = pd.read_csv(results / "analysis" / "remainder_ceiling.csv")
    if ceiling.returncode == 0:  # the tiny network's own accuracy is what the ceiling must reach
        assert ceilings["within_2_points"].iloc[-1] and ceiling.stdout.strip().endswith("epochs")
    else:
        assert not ceilings["within_2_points"].any() and "no candidate budget" in ceiling.stderr
    assert list(ceilings["rem_epochs"]) == [1, 2][:len(ceilings)] and ceilings["layer"].eq(0).all()

    layers = ["analysis.remainder", "layers", "--layers", "key", "--epochs", "1",  # greedy K = 2: 1, 8, 16
              "--out", str(results / "analysis" / "mutual_information.csv"), *common]
    made = run_main(*layers)
    assert made.returncode == 0, made.stderr
    assert "already analysed" in run_main(*layers).stdout
    mi = pd.read_csv(results / "analysis" / "mutual_information.csv")
    assert list(mi["layer"]) == [1, 8, 16] and set(mi["estimator"]) == {"remainder"}
    assert mi["ixy_paper"].between(0, 1).all() and (mi["ixx_paper"] == 1 - mi["ixx_bce"]).all()
    assert mi["pass_points"].eq(3).all() and mi["pass_seconds"].nunique() == 1 and ceilings["pass_points"].eq(1).all()

    made = run_main("analysis.mutual_info", "--runs", str(results / "runs"), "--layers", "1,8,16", "--epochs", "1",
                    "--out", str(results / "analysis" / "mutual_information.csv"), "--device", "cpu")
    assert made.returncode == 0, made.stderr
    mi = pd.read_csv(results / "analysis" / "mutual_information.csv")
    assert sorted(mi["estimator"].unique()) == ["1c2f", "remainder"]
    for target in ("fig10", "fig_info_plane"):
        assert build(target, results)[0].name == f"{target}.png"
        assert build(target, results, estimator="remainder")[0].name == f"{target}-remainder.png"
    if ceiling.returncode != 0:
        with pytest.raises(InfoProError, match="no budget .* brought the ceiling within 2 points"):
            chosen_epochs(results / "analysis" / "remainder_ceiling.csv",
                          RemainderSettings(batch_size=50, lr=0.1, precision="fp32"))


def figure_rows_of_e2e_and_greedy_k4() -> list[dict]:
    """Remainder rows of an E2E and a greedy SL K = 4 ResNet-32 at every layer point, as fig10 reads them."""
    return [dict(run_id=f"{regime}-K{K}", regime=regime, task_loss="", K=K, split="paper", seed=0, recipe="r",
                 epochs=160, train_images=50000, layer=layer, arch="resnet32",
                 module_end=layer in (4, 8, 12) and K == 4, estimator="remainder",
                 ixy_paper=0.9 - 0.01 * layer * (K > 1), ixx_paper=0.4, mi_train_images=50000,
                 mi_test_images=10000, rem_lr=0.4, rem_batch_size=512, rem_epochs=30, rem_precision="bf16")
            for regime, K in (("e2e", 1), ("greedy", 4)) for layer in range(1, 17)]


def test_the_figure_draws_the_paper_dashed_and_the_ceiling_dotted():
    import pandas as pd

    from infopro.layer_plots import fig10_mutual_information

    rows = figure_rows_of_e2e_and_greedy_k4()
    reference = pd.DataFrame([dict(quantity="ixy_paper_units", regime="greedy", K=K, layer=layer, value=value)
                              for K, value in ((4, 0.9), (8, 0.8)) for layer in range(1, 17)])  # no K = 8 rows
    budget = dict(arch="resnet32", recipe="r", rem_lr=0.4, rem_batch_size=512, rem_epochs=30, rem_precision="bf16")
    ceilings = pd.DataFrame([budget | dict(ixy_paper=0.88), budget | dict(recipe="a CPU fixture", ixy_paper=0.6),
                             budget | dict(rem_lr=0.1, ixy_paper=0.7)])  # other recipes' and budgets' ceilings
    figure = fig10_mutual_information(pd.DataFrame(rows), reference, ceilings)
    ixy = figure.axes[1]
    assert ixy.get_ylabel().startswith("I(h,y): remainder")
    dotted = [line for line in ixy.get_lines() if line.get_linestyle() == ":"]
    dashed = [line for line in ixy.get_lines() if line.get_linestyle() == "--"]
    assert len(dotted) == 1 and list(dotted[0].get_ydata()) == [0.88, 0.88]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [0.9] * 16
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "paper, greedy SL and E2E (read off)" in legend and any(label.startswith("ceiling") for label in legend)
    said = "Curves with fewer markers join only the layer points estimated so far"
    assert said not in " ".join(text.get_text() for text in figure.texts).replace("\n", " ")
    key_only = pd.DataFrame([row for row in rows if row["K"] == 1 or row["layer"] in (1, 4, 8, 12, 16)])
    footer = " ".join(text.get_text() for text in fig10_mutual_information(key_only, reference, ceilings).texts)
    assert said in footer.replace("\n", " ")
    second_seed = key_only[key_only["K"] == 4].assign(seed=1, run_id="greedy-K4-s1")  # beside a whole seed 0
    footer = " ".join(text.get_text() for text in
                      fig10_mutual_information(pd.concat([pd.DataFrame(rows), second_seed]), reference, ceilings).texts)
    assert said not in footer.replace("\n", " ")


def test_the_figure_marks_module_ends_and_the_last_layer_not_where_a_partial_curve_stops():
    import pandas as pd

    from infopro.layer_plots import fig10_mutual_information

    partial = pd.DataFrame([row for row in figure_rows_of_e2e_and_greedy_k4()
                            if (row["layer"] <= 10 if row["K"] == 1 else row["layer"] in (1, 4, 8, 12, 16))])
    ixy = fig10_mutual_information(partial).axes[1]
    marked = [sorted(collection.get_offsets()[:, 0].tolist()) for collection in ixy.collections]
    assert marked == [[], [4.0, 8.0, 12.0, 16.0]]  # E2E's curve stops at layer 10, short of its last point


def test_asking_for_an_estimator_without_rows_names_the_command_that_makes_them(tmp_path):
    import pandas as pd
    from conftest import REPO, run_main

    (tmp_path / "analysis").mkdir()
    committed = pd.read_csv(REPO / "results" / "analysis" / "mutual_information.csv")
    committed[committed["estimator"] == "1c2f"].to_csv(tmp_path / "analysis" / "mutual_information.csv", index=False)
    refused = run_main("analysis.build", "fig10", "--estimator", "remainder", "--results", str(tmp_path))
    assert refused.returncode == 2 and "python -m analysis.remainder ceiling" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1


def test_make_figures_draws_the_other_estimator_beside_the_default(tmp_path):
    """With the paper recipe's remainder rows short of its key points, fig10 is 1c2f's and the remainder's is
    drawn beside it; without any remainder row there is no other to draw."""
    import shutil

    import pandas as pd
    from conftest import REPO, run_main

    for folder in ("analysis", "reference"):
        shutil.copytree(REPO / "results" / folder, tmp_path / folder)
    csv = tmp_path / "analysis" / "mutual_information.csv"
    mi = pd.read_csv(csv)
    small_head = mi["estimator"] == "1c2f"
    e2e_stem = (mi["run_id"] == "cifar10-jpeg-resnet32-e2e-K1-s0") & (mi["layer"] == 1) & ~small_head
    mi[small_head | e2e_stem].to_csv(csv, index=False)
    drawn = run_main("analysis.build", "fig10", "--alternatives", "--results", str(tmp_path))
    assert drawn.returncode == 0, drawn.stderr
    assert sorted(path.name for path in (tmp_path / "figures").glob("*.png")) == ["fig10-remainder.png", "fig10.png"]
    mi[small_head].to_csv(csv, index=False)
    shutil.rmtree(tmp_path / "figures")
    assert run_main("analysis.build", "fig10", "--alternatives", "--results", str(tmp_path)).returncode == 0
    assert [path.name for path in (tmp_path / "figures").glob("*.png")] == ["fig10.png"]
    refused = run_main("analysis.build", "fig10", "--alternatives", "--estimator", "1c2f", "--results", str(tmp_path))
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
