"""Data-parallel training of the ordinary trainer: one replica of the network per rank, DDP per local module.

`torchrun --nproc_per_node R -m experiments.train ...` runs `infopro.train.train` on R ranks
with `DataParallel` as its replica set. `--batch-size` stays the global batch: every rank
draws the whole batch from the shared per-epoch generator (same order and augmentation as
one process) and trains on its contiguous share of the rows.

What makes R ranks compute what one process computes on the same global batch:

* Gradients: each local module is wrapped in its own DistributedDataParallel, so module k's
  gradients are averaged while module k+1 computes, and the gradient isolation between
  modules is kept. A rank weighs its mean losses by R·n_r/B (its n_r of the B rows), so the
  average is the gradient of the global batch's mean loss even when shards differ in size.
* BatchNorm: every BatchNorm2d (backbone, decoders, auxiliary heads) and BatchNorm1d (DGL's
  auxiliary MLP) takes its training statistics over the whole global batch (`GlobalStatistics`);
  per-shard statistics would be a different model. torch's SyncBatchNorm runs on GPUs only, this one on gloo too.
* Supervised contrastive loss: the anchors are a rank's rows, the contrast set is the whole
  batch, gathered differentiably.

Sums across ranks (statistics, gathered rows) are all-reduces whose gradient is again an
all-reduce, so each replica's gradient includes what its rows contribute to the other
ranks' losses. The result equals the single-process run up to float summation order (tested
on CPU with gloo); the run directory, run id and checkpoints are the single-process ones,
so either trainer resumes the other's run.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from infopro.config import TrainConfig
from infopro.distributed import Rank, broadcast, on_rank_zero
from infopro.errors import InfoProError
from infopro.local import InfoProObjective, LocalNet, upcast
from infopro.rundir import OpenedRun, load_splits, open_run
from infopro.train import OneProcess


class _SumOverRanks(torch.autograd.Function):
    """Σ_r t_r on every rank. Its gradient is that sum again: each rank's input feeds every rank's loss."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        total = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        total = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=ctx.group)
        return total, None


class RankSums:
    """Differentiable sums across the ranks that hold the shards of one global batch."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.batch_size = None  # of the current step, set by `DataParallel.share`

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return _SumOverRanks.apply(tensor, self.group)

    def gather_batch(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], int]:
        """Every rank's rows of each tensor (this rank's shard), in rank order, and where this rank's rows start.

        Each rank places its rows in a zero tensor of the global batch's length at its offset,
        and a sum across ranks fills it: shards may differ in size, and no host sync is needed.
        """
        rows = shard(self.batch_size, self.rank, self.world_size)
        gathered = []
        for tensor in tensors:
            before = tensor.new_zeros((rows.start, *tensor.shape[1:]))
            after = tensor.new_zeros((self.batch_size - rows.stop, *tensor.shape[1:]))
            gathered.append(self.sum(torch.cat([before, tensor, after])))
        return gathered, rows.start


class GlobalStatistics:
    """Batch normalisation whose training statistics are those of the whole global batch across ranks.

    Mixed into nn.BatchNorm2d and nn.BatchNorm1d (DGL's auxiliary MLP). Two-pass (mean, then
    mean squared deviation) for accuracy; the running statistics are updated as PyTorch's layers
    do (momentum, unbiased variance), identically on every rank. In eval mode it is the plain
    layer. Same parameters, buffers and state-dict keys.
    """

    def __init__(self, batchnorm: nn.Module, sums: RankSums):
        super().__init__(batchnorm.num_features, batchnorm.eps, batchnorm.momentum, batchnorm.affine,
                         batchnorm.track_running_stats)
        if batchnorm.momentum is None or not batchnorm.affine or not batchnorm.track_running_stats:
            raise InfoProError("data-parallel BatchNorm supports affine layers with running statistics "
                               "and a momentum (as every BatchNorm of this repository has)")
        self.weight, self.bias = batchnorm.weight, batchnorm.bias
        self.running_mean, self.running_var = batchnorm.running_mean, batchnorm.running_var
        self.num_batches_tracked = batchnorm.num_batches_tracked
        self.sums = sums

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(input)
        x = upcast(input)
        over = (0, *range(2, x.dim()))          # every dimension but the channels
        channels = (1, -1) + (1,) * (x.dim() - 2)
        per_channel = x.numel() // x.shape[1]
        local = torch.cat([x.sum(over), x.new_full((1,), per_channel)])
        total = self.sums.sum(local)
        count = total[-1].detach()
        mean = total[:-1] / count
        centered = x - mean.view(channels)
        var = self.sums.sum((centered * centered).sum(over)) / count
        with torch.no_grad():
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * count / (count - 1), self.momentum)
            self.num_batches_tracked += 1
        scale = self.weight * torch.rsqrt(var + self.eps)
        return (centered * scale.view(channels) + self.bias.view(channels)).to(input.dtype)


class GlobalBatchNorm2d(GlobalStatistics, nn.BatchNorm2d):
    """nn.BatchNorm2d with the whole global batch's statistics (backbone, decoders, auxiliary heads)."""


class GlobalBatchNorm1d(GlobalStatistics, nn.BatchNorm1d):
    """nn.BatchNorm1d with the whole global batch's statistics (DGL's auxiliary MLP)."""


GLOBAL_BATCHNORM = {nn.BatchNorm2d: GlobalBatchNorm2d, nn.BatchNorm1d: GlobalBatchNorm1d}


def globalise_batchnorm(module: nn.Module, sums: RankSums) -> None:
    """Replace, in place, every nn.BatchNorm2d and nn.BatchNorm1d under `module` by its global-statistics twin."""
    for name, child in module.named_children():
        if type(child) in GLOBAL_BATCHNORM:
            setattr(module, name, GLOBAL_BATCHNORM[type(child)](child, sums))
        else:
            globalise_batchnorm(child, sums)


def shard(batch_size: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s contiguous rows of a batch: sizes differ by at most one, the first ranks larger."""
    base, extra = divmod(batch_size, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


class DataParallel(OneProcess):
    """This rank as one of R replicas that share each batch (see the module docstring).

    Rank 0 opens the run directory, evaluates, writes and logs; every rank loads the data,
    keeps an identical copy of the network and optimizer, and hears rank 0's decisions.
    """

    def __init__(self, me: Rank):
        if me.device.type == "cuda" and me.backend != "nccl":
            raise InfoProError(f"data-parallel training needs one GPU per rank; {me.world_size} ranks share "
                               f"{torch.cuda.device_count()} GPU(s) on this machine")
        super().__init__(me.device)
        self.me = me
        self.writer = me.first
        self.row = {"ranks": me.world_size}
        # Our own group for the collectives inside forward and backward, apart from DDP's.
        self.sums = RankSums(dist.new_group(backend=me.backend))

    def open_run(self, config: TrainConfig, out, data_root, download: bool, resume: bool) -> OpenedRun | None:
        """Rank 0 opens the run directory; the others load the data once it has succeeded."""
        record = {"data_parallel": {"ranks": self.me.world_size, "backend": self.me.backend}}

        def open_on_rank_zero():
            data = load_splits(config, self.device, data_root, download)
            opened = open_run(config, out, data, self.device, resume, record, self.me.world_size)
            return opened, {"finished": opened.finished, "checkpoint": opened.checkpoint}

        opened, start = on_rank_zero(self.me, open_on_rank_zero)
        if start is None or self.writer:
            return opened
        _, train_split, test_split = load_splits(config, self.device, data_root, download)
        return OpenedRun(None, train_split, test_split, start["checkpoint"], start["finished"])

    def wrap(self, net: LocalNet) -> None:
        """Whole-batch BN and contrast sets, then one DDP per local module.

        Parameters of zero-weight terms never get a gradient (the term is not computed), so
        they are taken out of DDP's view, which otherwise waits for their gradients.
        """
        globalise_batchnorm(net, self.sums)
        for objective in net.objectives:
            if isinstance(objective, InfoProObjective):
                objective.gather_batch = self.sums.gather_batch
                for parameter in objective.idle_parameters():
                    parameter.requires_grad_(False)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.modules = [DistributedDataParallel(module, device_ids=device_ids) for module in net.local_modules]

    def share(self, batch_size: int) -> tuple[slice, float]:
        """This rank's rows, and the weight R·n_r/B that makes DDP's average the global mean's gradient."""
        self.sums.batch_size = batch_size
        rows = shard(batch_size, self.me.rank, self.me.world_size)
        return rows, self.me.world_size * (rows.stop - rows.start) / batch_size

    def total(self, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total, group=self.sums.group)
        return total

    def agree(self, value):
        """Rank 0's value, on every rank."""
        return broadcast(value, self.me)
