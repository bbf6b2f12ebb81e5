"""Module-parallel local learning over torch.distributed: one rank per local module.

Module k needs nothing from module k+1 (no gradient crosses a module boundary), so rank k
can train module k on batch t while rank k+1 trains module k+1 on batch t-1: a pipeline,
the paper's asynchronous InfoPro (Asy-InfoPro, docs/paper.md), which its authors never released.

Rank k owns module k's backbone layers, its objective (on the last rank: the head) and an
SGD optimizer over exactly those parameters. Rank 0 holds the data and draws every batch as
the synchronous trainer does; rank k > 0 receives from rank k-1 the detached activations,
the labels and, where a later objective reconstructs it, the augmented input; it trains its
module with `infopro.step.module_step` and sends its detached output on. Transport
(`infopro.rank_links`) is torch.distributed point-to-point: gloo on CPU and for ranks sharing a
GPU (staged through host memory), NCCL when every rank has a GPU of its own.

Why this is exactly the synchronous computation, at any staleness: rank k-1 produces batch
t's activations with its weights after t-1 updates, as the synchronous trainer's module k-1
does at step t, and module k's update depends only on those and on its own state. Staleness
changes when each module computes, never what. Hence one run-directory format: checkpoints
hold the whole network's state dict and one optimizer state in the synchronous trainer's
layout, and either trainer resumes the other's run.

Flow control: with `max_staleness` S, rank k starts batch t only once rank k+1 has finished
batch t-1-S (S = 0: no rank runs ahead of its successor; S > 0: modules overlap in time, at
most S+1 batches in flight per link). The largest lead observed is recorded per epoch. Each
epoch ends with one collective: the module states, optimizer states and statistics are
gathered on rank 0, which evaluates the whole network, writes the run directory and
broadcasts whether to go on, so every rank stops at the same point, on errors too.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from infopro.augment import augmented_batch, shuffled_batches
from infopro.bench import StepTimer
from infopro.config import TrainConfig, build_net, epoch_generator, learning_rate, set_learning_rate, sgd
from infopro.device import configure_backends, place, prepare_input
from infopro.distributed import Rank, broadcast, gather, on_rank_zero, to_cpu
from infopro.errors import InfoProError
from infopro.local import LocalNet
from infopro.rank_links import Downstream, Upstream, open_links
from infopro.records import read_json
from infopro.rundir import OpenedRun, load_splits, open_run
from infopro.step import correct_per_image, evaluate, module_step
from infopro.train import EpochBudget, check_finite, epoch_line, epoch_row, summarise


# ----- which parameters and buffers belong to which module

def module_parameters(net: LocalNet, k: int) -> list[int]:
    """Indices, in `net.parameters()` order, of the parameters local module k owns."""
    owner = net.module_of_parameter()
    return [i for i, (name, _) in enumerate(net.named_parameters()) if owner[name] == k]


def module_state_keys(net: LocalNet, k: int) -> list[str]:
    """State-dict keys (parameters and BN buffers) of local module k."""
    prefixes = [f"backbone.layers.{i}." for i in range(net.bounds[k], net.bounds[k + 1])]
    prefixes.append(f"objectives.{k}." if k < net.K - 1 else "backbone.head.")
    return [key for key in net.state_dict() if key.startswith(tuple(prefixes))]


def module_sgd(net: LocalNet, indices: list[int], config: TrainConfig) -> torch.optim.SGD:
    """The paper's SGD over the parameters `indices` (in `net.parameters()` order) of one module."""
    parameters = list(net.parameters())
    return sgd([parameters[i] for i in indices], config)


def merge_optimizer_states(states: list[dict], owned: list[list[int]]) -> dict:
    """K per-module SGD state dicts -> the state dict of one SGD over all parameters.

    `owned[k][j]` is the global index of module k's j-th parameter. The result is what the
    synchronous trainer's optimizer holds, so that trainer can resume a module-parallel run.
    """
    merged = {}
    for state, indices in zip(states, owned):
        merged |= {indices[j]: value for j, value in state["state"].items()}
    group = dict(states[0]["param_groups"][0])
    group["params"] = sorted(i for indices in owned for i in indices)
    return {"state": merged, "param_groups": [group]}


def module_optimizer_state(state: dict, indices: list[int]) -> dict:
    """The part of a whole-network SGD state dict that one module's optimizer holds."""
    local = {j: state["state"][i] for j, i in enumerate(indices) if i in state["state"]}
    group = dict(state["param_groups"][0])
    group["params"] = list(range(len(indices)))
    return {"state": local, "param_groups": [group]}


def batch_sizes(n: int, batch_size: int) -> list[int]:
    """Sizes of one epoch's batches (as `shuffled_batches` cuts them), known to every rank."""
    return [min(batch_size, n - start) for start in range(0, n, batch_size)]


# ----- training

@dataclass
class EpochStats:
    """What one rank reports at the end of an epoch."""

    loss_sum: float
    wrong: int | None
    max_lead: int
    busy_seconds: float


def train_module_epoch(net: LocalNet, optimizer, me: Rank, upstream: Upstream | None,
                       downstream: Downstream | None, sizes: list[int], config: TrainConfig, epoch: int,
                       train=None) -> EpochStats:
    """Rank k's share of one epoch: module k on every batch, in the synchronous trainer's order."""
    k = me.rank
    if me.first:
        generator = epoch_generator(config.seed, epoch, me.device)
        batches = shuffled_batches(len(train), config.batch_size, generator)
    loss_sum = torch.zeros((), device=me.device)
    wrong = torch.zeros((), dtype=torch.long, device=me.device)
    max_lead, timer = 0, StepTimer(me.device)  # CUDA events: no host synchronisation per step
    for t, size in enumerate(sizes):
        if downstream is not None:
            max_lead = max(max_lead, downstream.wait_for_credit(t))
        if me.first:
            x = augmented_batch(train.images[batches[t]], generator)
            y = train.labels[batches[t]]
            h = prepare_input(x, me.device)
        else:
            h, x, y = upstream.receive(size)
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        h, loss, batch_wrong = module_step(net.local_modules[k], h, x, y, config.precision)
        optimizer.step()
        timer.stop()
        loss_sum += loss.float() * size
        if me.last:
            wrong += batch_wrong
        if upstream is not None:
            upstream.acknowledge()
        if downstream is not None:
            downstream.send(h, x, y)
    if downstream is not None:
        downstream.close(len(sizes))
    if upstream is not None:
        upstream.close()
    return EpochStats(loss_sum.item(), wrong.item() if me.last else None, max_lead, sum(timer.seconds()))


def ideal_speedup(busy_seconds: list[float]) -> float:
    """Speed-up of a K-device pipeline over one device running the K modules in turn.

    One device needs the sum of the modules' compute times per batch; a full pipeline on K
    devices is paced by the slowest module (communication ignored).
    """
    return sum(busy_seconds) / max(busy_seconds)


@dataclass
class RankRun:
    """What one rank holds through its run. `opened` and `metrics` are rank 0's (None and [] elsewhere);
    `owned[k]`: the indices of module k's parameters, for merging the optimizers' states on rank 0."""

    config: TrainConfig
    me: Rank
    net: LocalNet
    optimizer: torch.optim.SGD
    owned: list[list[int]]
    max_staleness: int
    opened: OpenedRun | None
    metrics: list[dict]
    budget: EpochBudget
    log: Callable[[str], None]


def train_rank(config: TrainConfig, out, me: Rank, *, max_staleness: int = 0, data_root=None,
               download: bool = False, resume: bool = False, stop_after_epoch: int | None = None,
               time_budget: float | None = None, log=print) -> dict | None:
    """One rank's whole run; rank 0 returns the summary (None if stopped early), others None.

    Rank 0 opens the run directory; an error there (or a non-finite loss later) is broadcast,
    so every rank leaves at the same point instead of waiting for a dead peer.
    """
    check_ranks(config, me, max_staleness)
    configure_backends(me.device)
    net = place(build_net(config), me.device)
    owned = [module_parameters(net, k) for k in range(net.K)]
    optimizer = module_sgd(net, owned[me.rank], config)

    opened, begin = on_rank_zero(me, partial(open_pipeline_run, config, out, me, max_staleness, data_root,
                                             download, resume))
    if begin is None:  # rank 0 could not open the run, and says why
        return None
    if begin["finished"]:
        if me.first:
            log(f"{opened.run.path}: already complete ({config.epochs} epochs)")
            return read_json(opened.run.path / "summary.json")
        return None
    metrics, first_epoch = resume_module(net, optimizer, begin["checkpoint"], owned[me.rank])
    if me.first and begin["checkpoint"] is not None:
        log(f"resuming {opened.run.path} after epoch {first_epoch - 1}")
    run = RankRun(config, me, net, optimizer, owned, max_staleness, opened, metrics,
                  EpochBudget(stop_after_epoch, time_budget), log)
    decision, epoch, losses = train_epochs(run, first_epoch, begin["train_size"])
    return finish_run(run, decision, epoch, losses) if me.first else None


def check_ranks(config: TrainConfig, me: Rank, max_staleness: int) -> None:
    """Refuse, on every rank alike, a world size other than K and a staleness no rank could start under."""
    if config.K != me.world_size:
        raise InfoProError(f"K = {config.K} local modules need {config.K} ranks; got {me.world_size} "
                           f"(torchrun --nproc_per_node {config.K})")
    if max_staleness < 0:  # no rank could ever start a batch: every one would wait forever
        raise InfoProError(f"max_staleness must be 0 or more, got {max_staleness}")


def train_epochs(run: RankRun, first_epoch: int, train_size: int) -> tuple[str, int, list | None]:
    """Every rank's epochs from `first_epoch` on, each ended as rank 0 decides.

    Returns that decision ("done", "stop" or "diverged"), the last epoch trained and, on rank 0,
    its per-module mean losses.
    """
    net, me, config = run.net, run.me, run.config
    upstream, downstream = open_links(net, me, run.max_staleness, config.precision)
    sizes = batch_sizes(train_size, config.batch_size)
    keys = module_state_keys(net, me.rank)
    decision, epoch, losses = "continue", first_epoch - 1, None
    while decision == "continue":  # rank 0 says "done" after the last epoch
        epoch += 1
        lr = learning_rate(config, epoch)
        set_learning_rate(run.optimizer, lr)
        dist.barrier()
        began = time.perf_counter()
        stats = train_module_epoch(net, run.optimizer, me, upstream, downstream, sizes, config, epoch,
                                   run.opened.train if me.first else None)
        state = net.state_dict()
        reports = gather({"stats": stats, "state": to_cpu({key: state[key] for key in keys}),
                          "optimizer": to_cpu(run.optimizer.state_dict())}, me)
        if me.first:
            losses = [report["stats"].loss_sum / train_size for report in reports]
            decision = "diverged" if not all(map(math.isfinite, losses)) else end_epoch(
                run, reports, losses, epoch, lr, (time.perf_counter() - began, time.time()))
        decision = broadcast(decision, me)
    return decision, epoch, losses


def end_epoch(run: RankRun, reports: list[dict], losses: list[float], epoch: int, lr: float,
              timing: tuple[float, float]) -> str:
    """Rank 0 after an epoch: assemble the network, evaluate, record; say what comes next. `timing` is the
    epoch's (seconds, Unix time at its end)."""
    net, opened, config = run.net, run.opened, run.config
    state = {}
    for report in reports:
        state |= report["state"]
    net.load_state_dict(state)
    stats = [report["stats"] for report in reports]
    n = len(opened.train)
    seconds, ended_at = timing
    row = epoch_row(epoch, lr, losses, 100.0 * stats[-1].wrong / n, evaluate(net, opened.test, config.precision),
                    seconds, ended_at)
    row |= {"max_staleness": run.max_staleness, "max_lead": max(s.max_lead for s in stats)}
    row |= {f"busy_seconds_m{k + 1}": s.busy_seconds for k, s in enumerate(stats)}
    run.metrics.append(row)
    optimizer_state = merge_optimizer_states([report["optimizer"] for report in reports], run.owned)
    opened.run.save_epoch(net.state_dict(), optimizer_state, epoch, run.metrics)
    run.log(epoch_line(row, config.epochs, n) + f"  lead ≤ {row['max_lead']}")
    if epoch == config.epochs:
        return "done"
    return "stop" if run.budget.stop_after(epoch, config.epochs, seconds) else "continue"


def finish_run(run: RankRun, decision: str, epoch: int, losses: list) -> dict | None:
    """Rank 0 once the epochs have ended: the summary of a finished run, None for one stopped early."""
    opened = run.opened
    check_finite(losses, epoch, opened.run)
    if decision == "stop":
        run.log(f"stopped after epoch {epoch}/{run.config.epochs}; continue with --resume")
        return None
    summary = summarise(run.metrics, len(opened.train), {}, {}, opened.train.nbytes + opened.test.nbytes,
                        correct_per_image(run.net, opened.test, run.config.precision))
    summary["module_parallel"] = module_parallel_record(run.me, run.max_staleness) | pipeline_record(
        run.metrics, run.net.K)
    opened.run.finish(run.net.state_dict(), summary)
    return summary


def resume_module(net: LocalNet, optimizer, checkpoint: dict | None, owned: list[int]) -> tuple[list, int]:
    """Load a checkpoint (either trainer's) into the network and this rank's optimizer.

    Returns the metrics recorded so far and the first epoch to train.
    """
    if checkpoint is None:
        return [], 1
    net.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(module_optimizer_state(checkpoint["optimizer"], owned))
    return checkpoint["metrics"], checkpoint["epoch"] + 1


def module_parallel_record(me: Rank, max_staleness: int) -> dict:
    return {"ranks": me.world_size, "max_staleness": max_staleness, "backend": me.backend}


def pipeline_record(metrics: list[dict], K: int) -> dict:
    """The ideal K-device speed-up and the largest lead, over the epochs the pipeline trained.

    Epochs the synchronous trainer ran (a resumed run may hold some) have no `max_lead`.
    """
    pipelined = [row for row in metrics if "max_lead" in row]
    return {"ideal_speedup": ideal_speedup([sum(row[f"busy_seconds_m{k + 1}"] for row in pipelined)
                                            for k in range(K)]),
            "max_lead": max(row["max_lead"] for row in pipelined)}


def open_pipeline_run(config, out, me: Rank, max_staleness, data_root, download, resume):
    """Rank 0: data and run directory -> (opened run, what every rank must know)."""
    opened = open_run(config, out, load_splits(config, me.device, data_root, download), me.device, resume,
                      {"module_parallel": module_parallel_record(me, max_staleness)})
    return opened, {"finished": opened.finished, "checkpoint": opened.checkpoint, "train_size": len(opened.train)}
