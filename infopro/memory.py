"""Activation memory, measured the same way on any device.

`SavedActivations` counts the bytes of tensors that autograd saves for backward and that
are alive at the same time, peak over a training step. This is the quantity local learning
reduces (each module's graph is freed before the next module runs), it is exact on CPU
and GPU alike, and it does not depend on the allocator, cuDNN workspaces or fragmentation.
Parameters saved by autograd are not counted: they are resident anyway. A storage saved by
several operations (a ReLU output that is also the next convolution's input) counts once.

`PeakTensorMemory` is the wider, equally device-independent view the benchmark uses: the
peak bytes of *all* tensors created inside the enclosed code and alive at once (activations,
their gradients, temporaries, and the recomputation of gradient checkpointing, which saved-
tensor hooks cannot see). It is what `max_memory_allocated` measures, minus the allocator's
rounding and caching and minus what existed before (parameters, optimizer state, data).

On CUDA, `cuda_peak` adds the allocator's view (`max_memory_allocated`/`reserved`).
"""

import weakref
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _Saved:
    """Handle returned by the pack hook; its release is when autograd frees the saved tensor."""

    __slots__ = ("tensor", "key", "counter")

    def __init__(self, tensor, key, counter):
        self.tensor, self.key, self.counter = tensor, key, counter

    def __del__(self):
        self.counter._release(self.key)


class SavedActivations:
    """Context manager: peak bytes of simultaneously alive saved-for-backward tensors.

        with SavedActivations() as saved:
            train_step(...)
        saved.peak_bytes
    """

    def __init__(self):
        self.live = {}          # storage key -> [nbytes, references]
        self.current_bytes = 0
        self.peak_bytes = 0
        self._hooks = None

    def _pack(self, tensor):
        if isinstance(tensor, nn.Parameter):
            return tensor
        storage = tensor.untyped_storage()
        key = (tensor.device, storage.data_ptr())
        if key in self.live:
            self.live[key][1] += 1
        else:
            self.live[key] = [storage.nbytes(), 1]
            self.current_bytes += storage.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return _Saved(tensor, key, self)

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def _release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current_bytes -= entry[0]
            del self.live[key]

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


class PeakTensorMemory(TorchDispatchMode):
    """Context manager: peak bytes of tensors allocated inside it on `device_type` and alive at once.

    Every operator's outputs are seen through a dispatch mode (backward included); a storage
    is counted from its first appearance until its last reference dies (a weakref finaliser),
    so views and in-place results count once.
    """

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.live = {}
        self.current_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.device.type == self.device_type:
                self._track(tensor.untyped_storage(), inputs)
        return out

    def _track(self, storage, inputs: set) -> None:
        """Count a storage the op allocated; views and in-place results share an input's storage
        (which is either counted already or existed before, like a parameter)."""
        nbytes = storage.nbytes()
        key = storage.data_ptr()
        if nbytes == 0 or key in self.live or key in inputs:
            return
        self.live[key] = nbytes
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(storage, self._release, key)

    def _release(self, key) -> None:
        self.current_bytes -= self.live.pop(key, 0)


@contextmanager
def cuda_peak(device: torch.device, record: dict):
    """Fill `record` with peak allocated/reserved CUDA bytes of the enclosed code (None on CPU)."""
    if device.type != "cuda":
        record.update(peak_cuda_allocated_bytes=None, peak_cuda_reserved_bytes=None)
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield
    torch.cuda.synchronize(device)
    record.update(peak_cuda_allocated_bytes=torch.cuda.max_memory_allocated(device),
                  peak_cuda_reserved_bytes=torch.cuda.max_memory_reserved(device))
