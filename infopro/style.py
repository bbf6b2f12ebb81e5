"""One colour-blind-safe style for every figure: each method's and each K's colour, label and marker.

The palette is Okabe & Ito (2008); the labels are the paper's names of the methods.
"""

import functools

import matplotlib as mpl

# Okabe & Ito (2008) colour-blind-safe palette.
BLACK, ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
K_COLOURS = {1: BLACK, 2: BLUE, 3: PURPLE, 4: GREEN, 8: ORANGE, 16: VERMILLION}
METHODS = {  # key -> (label, colour, marker, line style)
    "e2e": ("E2E", BLACK, "D", "-"),
    "greedy": ("Greedy SL", VERMILLION, "o", "-"),
    "dgl": ("DGL", PURPLE, "v", "-"),
    "infopro-contrast": ("InfoPro (Contrast)", BLUE, "s", "-"),
    "infopro-softmax": ("InfoPro (Softmax)", GREEN, "^", "-"),
}
# The benchmark's families (`infopro.bench_methods`) -> (label, colour, marker). A family that is a training
# method keeps that method's colour and marker, so a method looks the same in fig_memory as in fig7 and fig8;
# InfoPro* (InfoPro cut at other points) keeps InfoPro's blue with a marker of its own; checkpointing,
# offloading and InfoPro with checkpointing take the palette's other colours.
BENCH_FAMILIES = {
    "e2e": METHODS["e2e"][:3], "greedy": METHODS["greedy"][:3], "dgl": METHODS["dgl"][:3],
    "infopro": ("InfoPro", *METHODS["infopro-contrast"][1:3]), "infopro-softmax": METHODS["infopro-softmax"][:3],
    "checkpoint": ("checkpointing", ORANGE, "P"), "offload": ("offload", SKY, "X"),
    "infopro-balanced": ("InfoPro* (balanced)", BLUE, "^"),
    "infopro+checkpoint": ("InfoPro + checkpointing", YELLOW, "v"),
}
RC = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
      "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3}


def local_methods() -> tuple[str, ...]:
    """The locally supervised methods, a panel each in fig8 and fig10: those added at run time included."""
    return tuple(method for method in METHODS if method != "e2e")


def styled(draw):
    """Run a figure function under the repository's rc style (fonts, grid, spines)."""
    @functools.wraps(draw)
    def wrapper(*args, **kwargs):
        with mpl.rc_context(RC):
            return draw(*args, **kwargs)
    return wrapper
