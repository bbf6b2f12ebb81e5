"""Processes of a torch.distributed job, under torchrun or spawned here; shared by both multi-rank trainers.

`infopro.module_parallel` runs one rank per local module, `infopro.data_parallel` one replica
of the whole network per rank. Both start the same way (one process per rank, a process
group over gloo or NCCL), exchange Python objects the same way (rank 0 decides, every rank
hears it) and stop the same way: a rank that fails stops every rank with one line.
"""

import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from infopro.errors import InfoProError


@dataclass(frozen=True)
class Rank:
    """This process's place in the job: its rank, the number of ranks and its device."""

    rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def first(self) -> bool:
        return self.rank == 0

    @property
    def last(self) -> bool:
        return self.rank == self.world_size - 1

    @property
    def transport_device(self) -> torch.device:
        """Where tensors travel: gloo moves host tensors only, NCCL device tensors."""
        return self.device if self.backend == "nccl" else torch.device("cpu")


def choose_backend(device: torch.device, local_world_size: int) -> str:
    """NCCL when every rank on this machine has a GPU of its own; gloo on CPU and when ranks share a GPU."""
    if device.type == "cuda" and local_world_size <= torch.cuda.device_count():
        return "nccl"
    return "gloo"


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """Ranks are spread over the visible GPUs round-robin (several may share one)."""
    if device.type == "cuda":
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return device


def to_cpu(obj):
    """Tensors in nested dicts and lists moved to host memory, for gathering on rank 0."""
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {key: to_cpu(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(value) for value in obj]
    return obj


def broadcast(obj, me: Rank):
    """`obj` from rank 0 to every rank (a Python object, pickled)."""
    box = [obj if me.first else None]
    dist.broadcast_object_list(box, src=0, device=me.transport_device)
    return box[0]


def gather(obj, me: Rank) -> list | None:
    """Every rank's `obj` as a list on rank 0 (None elsewhere)."""
    gathered = [None] * me.world_size if me.first else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def on_rank_zero(me: Rank, work):
    """Run `work()` -> (kept, shared) on rank 0 alone: rank 0 gets both, every other rank `shared`.

    A user error raised by `work` is raised again on rank 0 only, and every other rank gets
    None for `shared` and should return: no rank is left waiting on a peer that has gone.
    """
    kept, shared, error = None, None, None
    if me.first:
        try:
            kept, shared = work()
        except InfoProError as caught:
            error = caught
    failed, shared = broadcast((error is not None, shared), me)
    if error is not None:
        raise error
    return kept, None if failed else shared


def init_rank(rank: int, world_size: int, local_rank: int, local_world_size: int, device: torch.device,
              init_method: str) -> Rank:
    device = rank_device(device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = choose_backend(device, local_world_size)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return Rank(rank, world_size, device, backend)


def under_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def leave_group() -> None:
    """After a successful job: wait until every rank is done, then release gloo's worker threads.

    Tearing the group down while Python is fully alive matters: a gloo worker thread that drops
    the last reference to a tensor during interpreter shutdown aborts the process (SIGABRT).
    """
    dist.barrier()
    dist.destroy_process_group()


def run_as_torchrun_rank(job, device: torch.device) -> None:
    """This process is one of torchrun's ranks: join the group from its environment, run `job`.

    On an error the group is not torn down (peers may be mid-collective); torchrun stops them.
    """
    world_size = int(os.environ["WORLD_SIZE"])
    me = init_rank(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", 0)),
                   int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), device, "env://")
    job(me)
    leave_group()


def rank_failure(failure: mp.ProcessExitedException, message: Path) -> InfoProError:
    """The job's error for the first rank that ended: its own message where it left one, else how it died
    (killed, or an exit without a user error), with the rank's exit code."""
    if message.exists():
        error = InfoProError(f"rank {failure.error_index}: {message.read_text()}")
    else:
        how = f"was killed by {failure.signal_name}" if failure.signal_name else f"exited with code {failure.exit_code}"
        error = InfoProError(f"rank {failure.error_index} {how}, so every rank was stopped; "
                             f"finished epochs are kept (continue with --resume)")
    error.exit_code = failure.exit_code if failure.exit_code and failure.exit_code > 0 else 1
    return error


def error_file(folder: Path, rank: int) -> Path:
    """Where a spawned rank leaves the message of the user error that ended it, for the parent to report."""
    return folder / f"rank-{rank}.error"


def _spawned_rank(rank: int, world_size: int, folder: Path, device: torch.device, threads: int, job) -> None:
    """Body of a spawned rank: on a user error, its message for the parent and the error's exit code,
    never a traceback.

    It ends with os._exit, skipping interpreter shutdown, where gloo's threads can abort the
    process; on an error it leaves the group as it is, and the parent stops the other ranks.
    """
    torch.set_num_threads(threads)
    me = init_rank(rank, world_size, rank, world_size, device, f"file://{folder / 'store'}")
    code = 0
    try:
        job(me)
        leave_group()
    except InfoProError as error:
        error_file(folder, rank).write_text(str(error))
        code = error.exit_code
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def stop_ranks(processes) -> None:
    """Terminate the ranks still running and wait for every one: the caller (a notebook, the
    throughput benchmark) may live on, and must not be left with a rank still holding the run
    directory (rank 0 keeps its lock until it exits) or left unreaped."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()


def spawn_ranks(job, world_size: int, device: torch.device) -> None:
    """Run `job(rank)` in `world_size` fresh processes; the first one to fail stops them all, and the
    job ends with one line: that rank's own message, or how it died."""
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # our one line says it
    # The ranks share this process's CPU threads instead of each starting one per core.
    threads = max(1, torch.get_num_threads() // world_size)
    with tempfile.TemporaryDirectory(prefix="infopro-ranks-") as folder:
        context = mp.start_processes(_spawned_rank, args=(world_size, Path(folder), device, threads, job),
                                     nprocs=world_size, join=False, start_method="spawn")
        try:
            while not context.join():
                pass
        except mp.ProcessExitedException as failure:
            raise rank_failure(failure, error_file(Path(folder), failure.error_index)) from None
        finally:
            stop_ranks(context.processes)
