"""Serial frame sizes of the device app (firmware/tp_main.c sizes its one frame buffer the same way).

Layer: device.
"""

from __future__ import annotations


def rx_frame_bytes(n_features: int, n_classes: int) -> int:
    """The device app's one frame buffer (firmware/tp_main.c sizes it the same way from the header):
    the largest of a raw-feature request, its work area and the replies, rounded up to 4 bytes."""
    need = max(4 + 4 * n_features, 5 * n_features + 4 * n_classes, 9 + n_features + 4 * n_classes, 25)
    return (need + 3) // 4 * 4
