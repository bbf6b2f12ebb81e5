"""Where and in which numerics a network runs: the device, its backends, memory format and autocast."""

from contextlib import nullcontext

import torch

from infopro.augment import normalise
from infopro.errors import InfoProError


def resolve_device(name: str, remedy: str = "use --device cpu or auto") -> torch.device:
    """The torch device `name` (auto, cpu, cuda) names; `remedy` is what the refusal of a missing
    CUDA device tells to do, since which options exist depends on the command."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise InfoProError(f"unknown device {name!r}; valid: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise InfoProError(f"no CUDA device is available; {remedy}")
    return torch.device(name)


ATEN_GRAIN = 32768  # ATen splits an elementwise op into chunks of at least this many elements, one a thread


def configure_backends(device: torch.device) -> None:
    """cuDNN autotuning and TF32 on CUDA (both recorded in the provenance). On a CPU, one exponential
    shared by every thread before any training: in 1 to 4 fresh processes of 100, a process's first
    one came out in other last bits on the second thread's share, so that a run of the supervised
    contrastive term could not be replayed bit for bit (docs/training.md, "Replaying a run")."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    else:
        torch.exp(torch.zeros(torch.get_num_threads() * ATEN_GRAIN))


def place(net: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Move to `device`; channels-last on CUDA, where cuDNN's convolutions prefer it."""
    net = net.to(device)
    return net.to(memory_format=torch.channels_last) if device.type == "cuda" else net


def autocast(device: torch.device, precision: str, cache: bool = True):
    """bf16 autocast for `precision` "bf16", else nothing. `cache=False` for a CUDA graph's capture,
    which must not keep autocast's cached weight casts (`torch.cuda.make_graphed_callables`)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=cache)
    return nullcontext()


def prepare_input(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Normalised network input; channels-last on CUDA, where cuDNN's convolutions prefer it."""
    x = normalise(x)
    return x.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x

