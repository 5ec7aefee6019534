"""The Nature CNN's shape by arithmetic, without torch: the network (models/nature_cnn.py) is built
from it and the config's checks and memory models count from it, so the two cannot drift."""

NATURE_LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels, kernel, stride), no padding


def nature_out(h: int, w: int) -> tuple[int, int]:
    """The last conv's spatial size on (h, w) frames (below 1: frames too small for it)."""
    for _, k, st in NATURE_LAYERS:
        h, w = (h - k) // st + 1, (w - k) // st + 1
    return h, w
