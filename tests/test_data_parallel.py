"""Data-parallel training (gloo ranks, DDP per local module) against one process on the same global batch."""

import json
from functools import partial

import pandas as pd
import pytest
import torch

from conftest import run_cli
from infopro.config import TrainConfig, build_net
from infopro.data_parallel import DataParallel, shard
from infopro.distributed import spawn_ranks
from infopro.errors import InfoProError
from infopro.rundir import check_batches
from infopro.step import train_step
from infopro.train import train
from infopro.train_cli import replica_job

pytestmark = pytest.mark.slow  # one process per replica: minutes on 2 cores (make test-slow)

BATCH = 41  # odd: the ranks' shards differ in size
STEP_CASES = [
    ("e2e", 1, None, {}, 2),
    ("greedy", 4, None, {}, 3),
    ("dgl", 4, None, {}, 3),  # BatchNorm1d in its auxiliary MLP: whole-batch statistics too
    # module 1 reconstructs only, module 2 contrasts only: idle heads, and a contrast set across ranks
    ("infopro", 3, "contrast", {"lambda1": (1.0, 0.0), "lambda2": (0.0, 1.0)}, 2),
    ("infopro", 2, "softmax", {}, 2),
    ("infopro", 2, "contrast", {}, 2),  # both terms in one module, the paper's λ
]


def a_batch():
    generator = torch.Generator().manual_seed(1)
    return torch.rand(BATCH, 3, 32, 32, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator)


def step_state(config: TrainConfig, replicas=None) -> dict:
    """Gradients and BN buffers after one float64 step on `a_batch` (this rank's share of it)."""
    net = build_net(config).double()
    rows, scale = slice(None), 1.0
    if replicas is not None:
        replicas.wrap(net)
        rows, scale = replicas.share(BATCH)
    x, y = a_batch()
    train_step(net, x[rows].double(), y[rows], modules=replicas and replicas.modules, loss_scale=scale)
    return ({name: p.grad for name, p in net.named_parameters() if p.grad is not None}
            | dict(net.named_buffers()))


def save_step_state(me, config, path):
    state = step_state(config, DataParallel(me))
    if me.first:
        torch.save(state, path)


@pytest.mark.parametrize("regime,K,task,weights,ranks", STEP_CASES)
def test_a_data_parallel_step_is_the_single_process_step(regime, K, task, weights, ranks, tmp_path):
    """Float64, where the comparison is sharp (in fp32 these gradients at initialisation move
    by ~1% between fp32 and fp64 alone): gradients and BN running statistics agree to 1e-9."""
    config = TrainConfig(regime=regime, K=K, task_loss=task, dataset="synthetic", **weights)
    spawn_ranks(partial(save_step_state, config=config, path=tmp_path / "ddp.pt"), ranks, torch.device("cpu"))
    replicated, alone = torch.load(tmp_path / "ddp.pt", weights_only=True), step_state(config)
    assert replicated.keys() == alone.keys()
    for name in alone:
        torch.testing.assert_close(replicated[name], alone[name], rtol=1e-6, atol=1e-9, msg=name)


SMALL = dict(dataset="synthetic", train_subset=300, test_subset=128, epochs=2, batch_size=BATCH, lr=0.05,
             warmup_epochs=0)


def data_parallel(config: TrainConfig, out, ranks: int = 2, **options):
    options = {"data_root": None, "download": False, "resume": False, "time_budget": None} | options
    spawn_ranks(partial(replica_job, config=config, out=out, options=options), ranks, torch.device("cpu"))


def test_a_data_parallel_run_is_the_single_process_run_and_either_trainer_resumes_it(tmp_path):
    """Same run id, records and checkpoints. In fp32 the two drift apart by summation order only
    (the float64 step test above is the exact check). The task loss is softmax: the contrastive
    loss's temperature (0.07) amplifies that drift by a factor that depends on the CPU's kernels
    (after 16 steps, 1e-3 on an AMD EPYC, 7e-3 on an Intel Xeon), where softmax's stays near 1e-4."""
    config = TrainConfig(regime="infopro", K=2, task_loss="softmax", **SMALL)
    train(config, tmp_path / "alone", device="cpu", log=lambda line: None)
    data_parallel(config, tmp_path / "shared", stop_after_epoch=1)
    record = json.loads((tmp_path / "shared" / "config.json").read_text())
    assert record["run_id"] == config.run_id() and record["data_parallel"] == {"ranks": 2, "backend": "gloo"}
    train(config, tmp_path / "shared", device="cpu", resume=True, log=lambda line: None)

    shared, alone = (pd.read_csv(tmp_path / run / "metrics.csv") for run in ("shared", "alone"))
    assert list(shared["ranks"].fillna(1)) == [2, 1]
    losses = [c for c in alone.columns if c.startswith("loss_m")]
    pd.testing.assert_frame_equal(shared[losses], alone[losses], rtol=5e-3)
    weights = [torch.load(tmp_path / run / "model.pt", weights_only=True) for run in ("shared", "alone")]
    assert weights[0].keys() == weights[1].keys()


def test_shards_cover_the_batch_and_differ_by_at_most_one_row():
    rows = [shard(41, rank, 3) for rank in range(3)]
    assert [(r.start, r.stop) for r in rows] == [(0, 14), (14, 28), (28, 41)]
    greedy = TrainConfig(regime="greedy", K=2, batch_size=50)
    with pytest.raises(InfoProError, match=r"holds 1 image \(301 mod 50\), fewer than the 2 ranks"):
        check_batches(greedy, 301, ranks=2)
    check_batches(greedy, 300, ranks=2)
    check_batches(greedy, 301)


def test_dgl_refuses_a_last_batch_of_one_image_but_not_a_shard_of_one():
    """DGL's BatchNorm1d cannot normalise one sample; data-parallel statistics span the whole batch."""
    dgl = TrainConfig(regime="dgl", K=2, batch_size=50)
    with pytest.raises(InfoProError, match="holds 1 image .*fewer than the 2 that dgl's batch normalisation needs"):
        check_batches(dgl, 301)
    check_batches(dgl, 302, ranks=2)


def test_an_unshardable_batch_stops_every_rank_with_one_line(tmp_path, capfd):
    config = TrainConfig(regime="greedy", K=2, **{**SMALL, "train_subset": 301, "batch_size": 50})
    with pytest.raises(InfoProError, match="^rank 0: the last batch of each epoch holds 1 image "):
        data_parallel(config, tmp_path / "run", ranks=2)
    assert capfd.readouterr().err == ""
    assert not (tmp_path / "run").exists()


def test_torchrun_trains_data_parallel(tmp_path):
    done = run_cli("torch.distributed.run", "--nproc_per_node", "2", "-m", "experiments.train", "--regime", "greedy",
                   "--K", "2", "--dataset", "synthetic", "--train-subset", "128", "--test-subset", "64", "--epochs",
                   "1", "--batch-size", "64", "--device", "cpu", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("final test error") == 1  # rank 0 alone reports
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data_parallel"]["ranks"] == 2
    assert (tmp_path / "run" / "summary.json").exists()
