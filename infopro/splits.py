"""Where the network is cut into K local modules, and the paper's per-K loss weights: as data.

Split tables are transcribed from the paper's `configs.py` in its own `[stage, block]`
notation (docs/paper.md): a local module ends right after block `block` (0-based) of stage
`stage`, stage 0 being the stem. `module_ends` converts them into layer points (1-based;
the stem is point 1), which is how the rest of this repository addresses the network.

Loss weights λ1 (reconstruction, i.e. I(h,x)) and λ2 (task term, i.e. I(h,y)) are given for
the first local module and for module K-1, and interpolated linearly in between (docs/paper.md).
"""

from dataclasses import dataclass

from infopro.errors import InfoProError
from infopro.models import ARCHS

# (arch, split kind) -> K -> [stage, block] of each module end (K-1 of them)
PAPER_SPLITS = {
    ("resnet32", "paper"): {
        2: [[2, 1]],
        3: [[1, 4], [2, 4]],
        4: [[1, 2], [2, 1], [3, 0]],
        8: [[1, 0], [1, 2], [1, 4], [2, 1], [2, 3], [3, 0], [3, 2]],
        16: [[0, 0], [1, 0], [1, 1], [1, 2], [1, 3], [1, 4], [2, 0], [2, 1], [2, 2], [2, 3], [2, 4],
             [3, 0], [3, 1], [3, 2], [3, 3]],
    },
    ("resnet110", "paper"): {
        2: [[2, 8]],
        3: [[1, 17], [2, 17]],
        4: [[1, 11], [2, 7], [3, 3]],
        8: [[1, 4], [1, 11], [2, 0], [2, 7], [2, 14], [3, 3], [3, 10]],
        16: [[1, 1], [1, 4], [1, 7], [1, 10], [1, 13], [1, 16], [2, 1], [2, 4], [2, 7], [2, 11],
             [2, 15], [3, 1], [3, 5], [3, 9], [3, 13]],
    },
    # InfoPro*: modules of about equal activation memory instead of equal depth (CIFAR-10 table).
    ("resnet110", "balanced"): {
        2: [[1, 14]],
        3: [[1, 9], [2, 2]],
        4: [[1, 6], [1, 14], [2, 8]],
    },
}

# (arch, split kind) -> K -> ((λ1, λ2) of the first local module, (λ1, λ2) of module K-1),
# from the paper's released commands (comand.sh, contrast mode). The paper does not give
# values for InfoPro (Softmax) or for K=3 with equal-depth splits; see `loss_weights`.
PAPER_LOSS_WEIGHTS = {
    ("resnet32", "paper"): {2: ((5, 1), (0, 0)), 4: ((6, 0), (1, 2)), 8: ((5, 0), (0, 2)),
                            16: ((5, 0.05), (0.2, 0.5))},
    ("resnet110", "paper"): {2: ((5, 0.5), (0, 0)), 4: ((1, 0), (0, 1)), 8: ((5, 0), (0, 1)),
                             16: ((5, 0), (0.5, 1))},
    ("resnet110", "balanced"): {2: ((5, 0.1), (0, 0)), 3: ((5, 0), (5, 0.1)), 4: ((5, 0), (5, 0.1))},
}


def blocks_per_stage(arch: str) -> int:
    return (ARCHS[arch] - 2) // 6


def stage_block_to_point(arch: str, stage: int, block: int) -> int:
    """Layer point (1-based) at the end of block `block` of stage `stage` (stage 0 = stem)."""
    n = blocks_per_stage(arch)
    if stage == 0 and block == 0:
        return 1
    if not (1 <= stage <= 3 and 0 <= block < n):
        raise ValueError(f"{arch} has no block [{stage}, {block}]")
    return 1 + (stage - 1) * n + block + 1


def num_layer_points(arch: str) -> int:
    return 3 * blocks_per_stage(arch) + 1


def key_layer_points(arch: str, K: int, split: str = "paper") -> list[int]:
    """The layer points a per-layer analysis of a K-module network reads its story at: the first, every
    module end and the last; for E2E (K = 1) every point, as E2E is the reference at each K's module ends.

    Why a subset: the remainder estimator costs GPU-minutes per point, most for the early ones, and the
    paper's argument on I(h,y) (lost at the first module end, never regained) is read at these points."""
    last = num_layer_points(arch)
    if K == 1:
        return list(range(1, last + 1))
    return sorted({1, *module_ends(arch, K, split), last})


def split_kinds(arch: str) -> list[str]:
    return [kind for a, kind in PAPER_SPLITS if a == arch]


def module_ends(arch: str, K: int, split: str = "paper") -> list[int]:
    """Layer points after which each of the first K-1 local modules ends.

    `split` is "paper" (equal depth), "balanced" (InfoPro*, equal memory) or a custom list of
    layer points such as "4,8,12". The last module always ends at the network's head.
    """
    if arch not in ARCHS:
        raise InfoProError(f"unknown arch {arch!r}; valid: {', '.join(ARCHS)}")
    if K < 1:
        raise InfoProError(f"K must be at least 1, got {K}")
    if K == 1:
        if split not in ("paper", "balanced", ""):
            raise InfoProError("K=1 (end-to-end) has no module ends; drop --split")
        return []
    if split in ("paper", "balanced"):
        table = PAPER_SPLITS.get((arch, split), {})
        if K not in table:
            valid = ", ".join(f"{kind}: K in {sorted(PAPER_SPLITS[(arch, kind)])}" for kind in split_kinds(arch))
            raise InfoProError(f"no {split} split table for {arch} with K={K} ({valid}); "
                               f"pass --split with K-1 layer points, e.g. --split 4,8,12")
        return [stage_block_to_point(arch, *pair) for pair in table[K]]
    return custom_module_ends(arch, K, split)


def custom_module_ends(arch: str, K: int, split: str) -> list[int]:
    """Parse "4,8,12": strictly increasing layer points before the last one, K-1 of them."""
    last = num_layer_points(arch)
    try:
        ends = [int(item) for item in split.split(",")]
    except ValueError:
        raise InfoProError(f"--split must be 'paper', 'balanced' or comma-separated layer points, "
                           f"got {split!r}") from None
    if len(ends) != K - 1:
        raise InfoProError(f"--split {split} gives {len(ends) + 1} modules but K={K}")
    if any(b <= a for a, b in zip(ends, ends[1:])) or ends[0] < 1 or ends[-1] >= last:
        raise InfoProError(f"--split points must increase strictly within 1..{last - 1} for {arch}, got {split}")
    return ends


@dataclass(frozen=True)
class LossWeights:
    """λ1 (reconstruction) and λ2 (task term) of each local module, first to module K-1."""

    lambda1: tuple[float, ...]
    lambda2: tuple[float, ...]


def interpolate(first: float, last: float, count: int) -> tuple[float, ...]:
    """`count` values from `first` to `last`, linearly (just `first` when count is 1)."""
    if count == 1:
        return (float(first),)
    return tuple(first + (last - first) * i / (count - 1) for i in range(count))


def loss_weights(arch: str, K: int, split: str, lambda1=None, lambda2=None) -> LossWeights:
    """Per-module λ1, λ2 from explicit (first, last) pairs, else from the paper's per-K table.

    The paper published weights only for InfoPro (Contrast); we use the same table for
    InfoPro (Softmax), as the code shares one set of flags for both. Where the paper gives no
    weights (equal-depth K=3, custom splits) they must be passed explicitly.
    """
    if K == 1:
        return LossWeights((), ())
    if lambda1 is None or lambda2 is None:
        table = PAPER_LOSS_WEIGHTS.get((arch, split), {})
        if K not in table:
            raise InfoProError(f"the paper gives no λ1/λ2 for {arch} K={K} with split {split!r}; "
                               f"pass --lambda1 FIRST,LAST and --lambda2 FIRST,LAST")
        (first1, first2), (last1, last2) = table[K]
        lambda1 = lambda1 if lambda1 is not None else (first1, last1)
        lambda2 = lambda2 if lambda2 is not None else (first2, last2)
    return LossWeights(interpolate(*lambda1, K - 1), interpolate(*lambda2, K - 1))
