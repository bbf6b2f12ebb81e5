"""The largest batch that trains under a CUDA allocation cap, found by real trials.

`search_max_batches` needs only a function `peak_bytes(batch, cap)` (None: out of memory), so its
search is tested on a CPU with a stand-in; `cuda_peak_bytes` is that function on a GPU: two steps at
the batch under a real cap (`set_per_process_memory_fraction`). `infopro.bench_runner.max_batches`
runs a method's whole search in one fresh process.
"""

import gc

import torch

from infopro.bench import prepare_step
from infopro.bench_methods import Method


def largest_fitting(fits, guess: int = 32, limit: int = 1 << 16) -> int:
    """Largest batch size b <= limit with fits(b), assuming fits is monotone, to within 2% (or 8 images).

    From `guess` it steps outward, doubling the step each time, until one size fits and a
    larger one does not; then it bisects. A good guess settles in two or three trials, a bad
    one costs a few more, never a wrong answer. Returns 0 when nothing down to 8 images fits.
    """
    def close_enough(low, high):
        return high - low <= max(8, low // 50)

    guess, step = min(max(guess, 1), limit), max(8, guess // 50)
    low, high = (guess, None) if fits(guess) else (None, guess)
    while high is None:
        if low == limit:
            return low
        candidate = min(low + step, limit)
        low, high = (candidate, None) if fits(candidate) else (low, candidate)
        step *= 2
    while low is None:
        candidate = high - step
        if candidate < 1:
            low = 0
        elif fits(candidate):
            low = candidate
        else:
            high = candidate
        step *= 2
    while not close_enough(low, high):
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def predicted_batch(peaks: dict[int, int], cap_bytes: float, fallback: int = 32) -> int:
    """The batch at which a least-squares line bytes = fixed + per_image * batch through the
    trials that fit (`peaks`: batch -> peak bytes) reaches `cap_bytes`; `fallback` without a line."""
    if len(peaks) < 2:
        return fallback
    batches = torch.tensor(list(peaks), dtype=torch.float64)
    bytes_ = torch.tensor(list(peaks.values()), dtype=torch.float64)
    per_image = ((batches - batches.mean()) * (bytes_ - bytes_.mean())).sum() / ((batches - batches.mean()) ** 2).sum()
    if per_image <= 0:
        return fallback
    fixed = bytes_.mean() - per_image * batches.mean()
    return max(1, int((cap_bytes - fixed) / per_image))


def search_max_batches(peak_bytes, caps_bytes: list[float], calibration=(64, 128)) -> list[int]:
    """Largest batch under each cap, in the order of `caps_bytes`, for one method.

    `peak_bytes(batch, cap)` trains real steps at `batch` under allocation cap `cap` (None:
    uncapped) and returns their peak bytes, or None if they ran out of memory. Two uncapped
    calibration trials, and every trial that fits after them, fit the line each cap's search
    starts from; real trials alone decide the answer.
    """
    peaks = {}

    def fits_under(cap):
        def fits(batch):
            peak = peak_bytes(batch, cap)
            if peak is not None:
                peaks[batch] = peak
            return peak is not None
        return fits

    for batch in calibration:
        fits_under(None)(batch)
    return [largest_fitting(fits_under(cap), predicted_batch(peaks, cap)) for cap in caps_bytes]


def cuda_index(device: torch.device) -> int:
    """The ordinal of a CUDA device: `set_per_process_memory_fraction` refuses a bare "cuda"."""
    return torch.cuda.current_device() if device.index is None else device.index


def cuda_peak_bytes(method: Method, arch: str, precision: str, device: torch.device):
    """`peak_bytes(batch, cap)` for `search_max_batches` on CUDA: two steps at `batch` under a
    real cap (`set_per_process_memory_fraction`); the allocator's cache is emptied after each trial."""
    index = cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory

    def two_steps(batch):
        _, optimizer, _, forward_backward = prepare_step(method, arch, batch, precision, device)
        for _ in range(2):
            forward_backward()
            optimizer.step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)

    def peak_bytes(batch, cap):
        torch.cuda.set_per_process_memory_fraction(1.0 if cap is None else min(1.0, cap / total), index)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            peak = two_steps(batch)
        except torch.OutOfMemoryError:
            peak = None
        gc.collect()  # the failed trial's tensors, held by its traceback until here
        torch.cuda.empty_cache()
        return peak

    return peak_bytes
