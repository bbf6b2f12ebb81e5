"""Where the GPU's idle time goes: the gap analysis of a profiler trace, on traces whose answer is known."""

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from infopro.trace import Span, Waits, gpu_idle, trace_spans


def test_each_gap_is_put_down_to_its_cause():
    """Two steps' worth of activity (µs): each gap's cause is built in, so the per-step sums are known."""
    device = [Span("gemm", 0, 10, 1),
              Span("relu", 10.5, 20, 2),     # launched at 2, before the GPU went idle at 10: queued 0.5
              Span("conv", 30, 40, 3),       # launched at 29, no wait overlaps 20-30: dispatch 10
              Span("bn", 60, 70, 4),         # launched at 58 after a synchronisation in the gap: sync 20
              Span("add", 80, 90, 5),        # launched at 79 after a cudaFree in the gap: allocator 10
              Span("sum", 95, 100, 6),       # no launch call carries its id: unmatched 5
              Span("Memcpy HtoD", 100, 108, 7),
              Span("copy_", 104, 112, 8)]    # overlaps the copy (another stream): no gap
    host = [Span("cudaLaunchKernel", -5, -4, 1), Span("cudaLaunchKernel", 2, 3, 2),
            Span("cudaLaunchKernel", 29, 29.5, 3), Span("cudaStreamSynchronize", 41, 55),
            Span("cudaLaunchKernel", 58, 58.5, 4), Span("cudaFree", 71, 78), Span("cuLaunchKernel", 79, 79.5, 5),
            Span("cudaMemcpyAsync", 96, 97, 7), Span("cudaLaunchKernel", 97, 98, 8)]
    idle = gpu_idle(device, host, steps=2)
    idle_microseconds = {"queued": 0.5, "dispatch": 10, "sync": 20, "allocator": 10, "copy": 0, "unmatched": 5}
    for cause, microseconds in idle_microseconds.items():
        assert idle[f"idle_{cause}_ms_per_step"] == pytest.approx(microseconds / 2000), cause
    assert idle["idle_ms_per_step"] == pytest.approx(45.5 / 2000)
    assert idle["busy_ms_per_step"] + idle["idle_ms_per_step"] == pytest.approx(idle["profiled_ms_per_step"])
    assert idle["profiled_ms_per_step"] == pytest.approx(112 / 2000)
    assert idle["gaps_per_step"] == 2.5 and idle["activities_per_step"] == 4
    assert (idle["longest_gap_ms"], idle["longest_gap_cause"]) == (0.020, "sync")
    assert idle["matched_share"] == 7 / 8
    assert idle["launch_calls_per_step"] == 3  # six launches and copies; the one at -5 is before the window
    assert (idle["sync_calls_per_step"], idle["allocator_calls_per_step"], idle["copy_calls_per_step"]) == (0.5, 0.5, 0)


def test_a_kernel_launched_before_the_gap_is_queued_even_while_the_host_waits():
    """The host's synchronisation overlaps the gap, but the kernel ending it was already launched."""
    idle = gpu_idle([Span("a", 0, 10, 1), Span("b", 15, 20, 2)],
                    [Span("cudaLaunchKernel", 1, 2, 2), Span("cudaDeviceSynchronize", 3, 30)], steps=1)
    assert idle["idle_queued_ms_per_step"] == pytest.approx(0.005) and idle["idle_sync_ms_per_step"] == 0


def test_zero_correlation_ids_link_nothing():
    """Id 0 means 'not linked': a profiler that links nothing must show as unmatched, not as dispatch;
    a wait that overlaps a gap still names it."""
    idle = gpu_idle([Span("a", 0, 10), Span("b", 15, 20), Span("c", 30, 40)],
                    [Span("cudaLaunchKernel", 12, 13), Span("cudaMalloc", 21, 28)], steps=1)
    assert idle["idle_unmatched_ms_per_step"] == pytest.approx(0.005) and idle["matched_share"] == 0
    assert idle["idle_allocator_ms_per_step"] == pytest.approx(0.010)


def test_waits_find_an_overlap_behind_a_later_shorter_call():
    """A long call that began first still overlaps an interval after a short call has ended; touching
    ends do not overlap."""
    waits = Waits([Span("cudaFree", 10, 20), Span("cudaMalloc", 0, 100), Span("cudaFree", 120, 130)])
    assert waits.overlap(50, 60) and waits.overlap(125, 200) and waits.overlap(-5, 1)
    assert not waits.overlap(100, 120) and not waits.overlap(-10, 0) and not waits.overlap(130, 140)
    assert not Waits([]).overlap(0, 1)


def test_no_gpu_activity_gives_no_record_and_one_busy_interval_no_gap():
    assert gpu_idle([], [Span("cudaLaunchKernel", 0, 1, 1)], steps=1) == {}
    idle = gpu_idle([Span("a", 0, 10, 1), Span("b", 5, 20, 2)], [], steps=1)
    assert (idle["idle_ms_per_step"], idle["gaps_per_step"], idle["longest_gap_cause"]) == (0, 0, "")


def test_trace_spans_keeps_gpu_activity_and_the_hosts_cuda_calls():
    """The profiler's own event class, as it would be filled on CUDA. A GPU user annotation spans the
    gaps between the kernels it encloses: left out. ATen operators are the host's, but not CUDA calls;
    cuDNN's names do not pass for driver calls."""
    def event(name, device_type, start, end, id=0, annotation=False):
        return FunctionEvent(id=id, name=name, thread=0, start_us=start, end_us=end, device_type=device_type,
                             is_user_annotation=annotation)

    events = [event("volta_sgemm", DeviceType.CUDA, 5, 10, 7), event("Optimizer.step#SGD.step", DeviceType.CUDA, 0, 50,
                                                                     annotation=True),
              event("cudaLaunchKernel", DeviceType.CPU, 1, 2, 7), event("cuLaunchKernelEx", DeviceType.CPU, 3, 4, 8),
              event("aten::add", DeviceType.CPU, 0, 3), event("cudnnConvolutionForward", DeviceType.CPU, 0, 3)]
    device, host = trace_spans(events)
    assert device == [Span("volta_sgemm", 5, 10, 7)]
    assert [span.name for span in host] == ["cudaLaunchKernel", "cuLaunchKernelEx"]


