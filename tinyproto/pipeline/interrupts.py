"""Ctrl-C during a long run that starts threads and worker processes (dask): a KeyboardInterrupt that lands in a
finalizer is not lost, so an interrupted run writes nothing (the workers themselves start deaf to Ctrl-C:
core/dask_cluster.py).

Layer: pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def interrupts_kept() -> Iterator[Callable[[], None]]:
    """Ctrl-C raises KeyboardInterrupt wherever the main thread is, also inside a finalizer (dask's Future.__del__
    runs whenever a result is dropped), where Python prints "Exception ignored ..." and drops it: the run would go
    on and write its output. While this is active, a SIGINT that lands in a finalizer is raised again a moment
    later, outside it (`_thread.interrupt_main`), and the function yielded raises KeyboardInterrupt if a SIGINT
    was received (called at every progress step and before anything is written). Only Python's default handler
    is replaced: an ignored SIGINT stays ignored."""
    import _thread
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: None
        return
    state = {"received": False, "raised": False}

    def handler(signum, frame) -> None:
        state["received"] = True
        if state["raised"]:  # the KeyboardInterrupt is on its way: the cleanup is not interrupted again
            return
        if in_finalizer(frame):
            timer = threading.Timer(0.05, _thread.interrupt_main)
            timer.daemon = True
            timer.start()
            return
        state["raised"] = True
        raise KeyboardInterrupt

    def interrupted() -> None:
        if state["received"]:
            state["raised"] = True
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False
