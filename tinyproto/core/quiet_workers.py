"""Imported only by the fork server that tinyproto's dask worker processes are forked from (core/dask_cluster.py):
the server's standard output and error, and so every worker's, go to /dev/null.

A worker that is starting when the run is interrupted (Ctrl-C, an error that closes the cluster) finds the
cluster's resources gone and would print a traceback over the user's terminal. Nothing a worker prints is for the
user: its results and its errors come back through dask to the process that shows them.

Layer: core.
"""

from __future__ import annotations

import os


def _silence() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    finally:
        os.close(devnull)


_silence()
