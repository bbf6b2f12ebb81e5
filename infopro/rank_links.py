"""The links between consecutive ranks of a module-parallel run (`infopro.module_parallel`).

Each link carries, per batch, module k's detached output h, the labels and, where a later
objective reconstructs it, the augmented input x; back along it go acknowledgements, which bound
how far rank k runs ahead of rank k+1 (`max_staleness`; the flow control of
`infopro.module_parallel`'s docstring).
"""

from collections import deque

import torch
import torch.distributed as dist

from infopro.device import autocast, prepare_input
from infopro.distributed import Rank
from infopro.local import InfoProObjective, LocalNet, run_layers


def reconstructs_input(net: LocalNet, k: int) -> bool:
    """Whether module k's objective reconstructs the augmented input x (InfoPro, λ1 > 0)."""
    return k < net.K - 1 and isinstance(net.objectives[k], InfoProObjective) and net.objectives[k].lambda1 > 0


@torch.no_grad()
def boundary_dtypes(net: LocalNet, precision: str, device: torch.device) -> list[torch.dtype]:
    """dtype of each module's output under `precision` (bf16 autocast may change it).

    h travels in its own dtype, which keeps the pipeline the synchronous computation bit for bit.
    """
    was_training = net.training
    net.eval()
    h = prepare_input(torch.zeros(2, 3, 32, 32, device=device), device)
    dtypes = []
    for k in range(net.K - 1):
        with autocast(device, precision):
            h = run_layers(net.segment(k), h)
        dtypes.append(h.dtype)
    net.train(was_training)
    return dtypes


class Upstream:
    """Rank k's end of the link from rank k-1: receives batches, acknowledges finished ones."""

    def __init__(self, me: Rank, shape: tuple[int, ...], dtype: torch.dtype, with_input: bool):
        self.me, self.shape, self.dtype, self.with_input = me, shape, dtype, with_input
        self.pending = []

    def _recv(self, shape, dtype) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype, device=self.me.transport_device)
        dist.recv(buffer, src=self.me.rank - 1)
        return buffer.to(self.me.device)

    def receive(self, size: int):
        """(h, x or None, y) of the next batch of `size` samples."""
        h = self._recv((size, *self.shape), self.dtype)
        if self.me.device.type == "cuda" and self.dtype.is_floating_point:
            h = h.contiguous(memory_format=torch.channels_last)
        x = self._recv((size, 3, 32, 32), torch.float32) if self.with_input else None
        return h, x, self._recv((size,), torch.int64)

    def acknowledge(self) -> None:
        """Tell rank k-1 that module k has finished one more batch (its credit for staleness)."""
        self.pending.append(dist.isend(torch.ones(1, device=self.me.transport_device), dst=self.me.rank - 1))

    def close(self) -> None:
        for work in self.pending:
            work.wait()
        self.pending.clear()


class Downstream:
    """Rank k's end of the link to rank k+1: sends batches within the staleness bound."""

    def __init__(self, me: Rank, max_staleness: int, with_input: bool):
        self.me, self.max_staleness, self.with_input = me, max_staleness, with_input
        self.in_flight = deque()   # send handles (and their tensors) of unacknowledged batches
        self.finished = 0          # batches rank k+1 has acknowledged this epoch

    def _await_acknowledgement(self) -> None:
        dist.recv(torch.empty(1, device=self.me.transport_device), src=self.me.rank + 1)
        for work in self.in_flight.popleft():
            work.wait()
        self.finished += 1

    def wait_for_credit(self, t: int) -> int:
        """Block until batch t may start; return the lead then (batches rank k+1 has not finished)."""
        while t - self.finished > self.max_staleness:
            self._await_acknowledgement()
        return t - self.finished

    def send(self, h: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        tensors = [h, x, y] if self.with_input else [h, y]
        staged = [t.to(self.me.transport_device).contiguous() for t in tensors]
        self.in_flight.append([dist.isend(t, dst=self.me.rank + 1) for t in staged])

    def close(self, batches: int) -> None:
        """End of epoch: wait until rank k+1 has finished every batch sent."""
        while self.finished < batches:
            self._await_acknowledgement()
        self.finished = 0


def open_links(net: LocalNet, me: Rank, max_staleness: int, precision: str):
    """This rank's (upstream, downstream) ends; None at the first and last rank respectively.

    A link carries the augmented input x only where some later module reconstructs it.
    """
    upstream = None if me.first else Upstream(
        me, net.backbone.layer_shape(net.bounds[me.rank]), boundary_dtypes(net, precision, me.device)[me.rank - 1],
        any(reconstructs_input(net, j) for j in range(me.rank, net.K)))
    downstream = None if me.last else Downstream(
        me, max_staleness, any(reconstructs_input(net, j) for j in range(me.rank + 1, net.K)))
    return upstream, downstream
