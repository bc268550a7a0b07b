"""The device app's frame and SRAM sizes, as decided once in tinyproto/core/wire.py (which also writes them into
every project's include/tinyproto_sizes.h for the firmware). Re-exported here for the device layer's users.

Layer: device.
"""

from __future__ import annotations

from tinyproto.core.wire import AppSram, app_sram, frame_buffer_bytes, n_chunks

__all__ = ["AppSram", "app_sram", "frame_buffer_bytes", "n_chunks"]
