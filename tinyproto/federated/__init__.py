"""Federated FlyNN: one model trained by parties that keep their rows.

Layer: federated (above families and device, below pipeline). protocol.py is the coordinator (the order of the
all-reduces); stats.py the exact sums and the distributed quantile; shards.py the division of the rows; dp.py
the differentially private release; config.py the shared configuration and the models built from it; party.py
what each party computes on its own shard; local_parties.py, dask_parties.py and device_parties.py where the
parties run; selection.py the federated choice of the shape; device_learning.py the learning firmware and the
dialogue with a device that learns (used by `tinyproto learn` too).
"""
