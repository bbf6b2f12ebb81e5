"""Where a GPU's idle time goes in profiled training steps, from a `torch.profiler` trace.

Why: a step's kernels can fill less than its wall time (checkpointing and InfoPro K = 16 leave
a fifth of the step idle on an H100), and the operator profile cannot say why: it sums kernel
times and drops the timeline. The timeline can. Each gap between the GPU's busy intervals is
put down to one of

* ``queued``   the activity that ends the gap was launched before the gap began: the GPU had
               work and took this long to start it (its own latency between kernels);
* ``sync``, ``allocator``, ``copy``  it was launched during the gap, while (or after) the host
               sat in a synchronisation, an allocator call (cudaMalloc/cudaFree; a cudaFree
               synchronises the device) or a blocking copy that overlaps the gap (so named
               too when the launch is unknown);
* ``dispatch`` it was launched during the gap and none of those calls overlaps it: the host was
               still dispatching operators (Python, autograd, ATen) when the GPU ran dry;
* ``unmatched`` no host call carries the activity's correlation id (the profiler linked none)
               and no wait overlaps the gap: the launch time is unknown.

A kernel and the runtime call that launched it share a correlation id in the profiler's events
(`FunctionEvent.id`); `matched_share` says for how many activities the link was found, so a
profiler that links none shows as such rather than as dispatch. The profiler adds its own cost to
every operator the host dispatches, so the dispatch share it finds is an upper bound: set its
`profiled_ms_per_step` beside the step time measured without it.
"""

import re
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from torch.autograd import DeviceType

HOST_WAITS = (("sync", re.compile("Synchronize")), ("allocator", re.compile("alloc|free", re.IGNORECASE)),
              ("copy", re.compile(r"^cu(da)?Memcpy(?!.*Async)")))  # the order in which a gap's cause is chosen
LAUNCH = re.compile("Launch|Memcpy|Memset")  # the host calls that put work on the GPU
RUNTIME_CALL = re.compile(r"^cu(da)?[A-Z]")  # CUDA runtime (cudaLaunchKernel) and driver (cuLaunchKernel) calls
CAUSES = ("queued", *(cause for cause, _ in HOST_WAITS), "dispatch", "unmatched")


@dataclass(frozen=True)
class Span:
    """One event of a trace: its name, start and end (µs) and correlation id."""

    name: str
    start: float
    end: float
    id: int = 0


def trace_spans(events) -> tuple[list[Span], list[Span]]:
    """The GPU's activities (kernels, copies, fills) and the host's CUDA calls among a profiler's events.

    GPU user annotations (`record_function` ranges mirrored on the device, e.g. the optimizer's
    step) are left out: they span the gaps between the kernels they enclose.
    """
    device, host = [], []
    for event in events:
        span = Span(event.name, event.time_range.start, event.time_range.end, event.id)
        if event.device_type == DeviceType.CUDA and not getattr(event, "is_user_annotation", False):
            device.append(span)
        elif event.device_type == DeviceType.CPU and RUNTIME_CALL.match(event.name):
            host.append(span)
    return device, host


def busy_intervals(device: list[Span]) -> list[tuple[float, float, Span]]:
    """The intervals in which the GPU is busy (overlapping activities joined), each with the
    activity that opened it."""
    intervals = []
    for span in sorted(device, key=lambda span: span.start):
        if intervals and span.start <= intervals[-1][1]:
            start, end, first = intervals[-1]
            intervals[-1] = (start, max(end, span.end), first)
        else:
            intervals.append((span.start, span.end, span))
    return intervals


class Waits:
    """The host's calls of one kind of wait, asked whether any overlaps an interval in O(log n).

    Why not a scan: a trace of five InfoPro K = 16 steps holds tens of thousands of gaps."""

    def __init__(self, calls: list[Span]):
        calls = sorted(calls, key=lambda call: call.start)
        self.starts = [call.start for call in calls]
        self.reach = list(accumulate((call.end for call in calls), max))  # the latest end so far

    def overlap(self, start: float, end: float) -> bool:
        begun = bisect_left(self.starts, end)  # the calls that start before `end`
        return begun > 0 and self.reach[begun - 1] > start


def gap_cause(gap_start: float, gap_end: float, launch: Span | None, waits: dict[str, Waits]) -> str:
    """Why the GPU idled from `gap_start` to `gap_end`, given the call that launched the activity
    ending the gap (None: not found) and the host's waiting calls by cause, in HOST_WAITS order
    (see the module's docstring)."""
    if launch is not None and launch.start < gap_start:
        return "queued"
    for cause, calls in waits.items():
        if calls.overlap(gap_start, gap_end):
            return cause
    return "unmatched" if launch is None else "dispatch"


def gpu_idle(device: list[Span], host: list[Span], steps: int) -> dict:
    """Per step: the GPU's busy and idle time (ms) between its first and last activity, the idle
    time by cause, and the host's CUDA calls (launches, waits) made in that window ({} if the
    profiler recorded no GPU activity)."""
    if not device:
        return {}
    busy = busy_intervals(device)
    window_start, window_end = busy[0][0], busy[-1][1]
    launches = {call.id: call for call in host if call.id and LAUNCH.search(call.name)}
    waits = {cause: Waits([call for call in host if pattern.search(call.name)]) for cause, pattern in HOST_WAITS}
    gaps = [(gap_end - gap_start, gap_cause(gap_start, gap_end, launches.get(opener.id), waits))
            for (_, gap_start, _), (gap_end, _, opener) in zip(busy, busy[1:])]
    idle = dict.fromkeys(CAUSES, 0.0)
    for length, cause in gaps:
        idle[cause] += length
    longest, longest_cause = max(gaps, default=(0.0, ""))
    in_window = [call for call in host if window_start <= call.start and call.end <= window_end]
    launched = [call for call in in_window if LAUNCH.search(call.name)]

    def ms_per_step(microseconds: float) -> float:
        return microseconds / 1000 / steps

    record = {"profiled_ms_per_step": ms_per_step(window_end - window_start),
              "busy_ms_per_step": ms_per_step(sum(end - start for start, end, _ in busy)),
              "idle_ms_per_step": ms_per_step(sum(idle.values())),
              "gaps_per_step": len(gaps) / steps,
              "longest_gap_ms": longest / 1000, "longest_gap_cause": longest_cause}  # one stall, or many small?
    record |= {f"idle_{cause}_ms_per_step": ms_per_step(idle[cause]) for cause in CAUSES}
    record |= {"activities_per_step": len(device) / steps,
               "matched_share": sum(span.id in launches for span in device) / len(device),
               "launch_calls_per_step": len(launched) / steps,
               "launch_call_ms_per_step": ms_per_step(sum(call.end - call.start for call in launched))}
    record |= {f"{cause}_calls_per_step": sum(bool(pattern.search(call.name)) for call in in_window) / steps
               for cause, pattern in HOST_WAITS}
    return record
