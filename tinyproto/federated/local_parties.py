"""Where the parties run: the backend interface, and every party in this process (`LocalBackend`).

Layer: federated. `handles[i]` stands for party i's shard wherever it lives; `derive` keeps a per-party result
there (another handle list); `map` brings per-party results to the coordinator; `allreduce` sums them (a tree of
exact additions). Other backends: dask_parties.DaskBackend (dask.distributed workers) and
device_parties.DeviceBackend (simulated or real Unos that learn their shard's counts).

A party function marked `row_wise` computes each of its rows on its own and adds the rows' results exactly
(integer tallies, counts): on the parties' rows pooled it gives what the all-reduce of the per-party results
gives, and a per-row result of the pool cut at the parties' row counts is what each party derives. LocalBackend
holds every party in one process and calls such a function once on the pooled rows instead of once per party (a
thousand parties of a few rows spent most of their selection in Python calls, not in arithmetic); other
backends call it per party, where the rows live.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tinyproto.federated.config import FederatedSpec
from tinyproto.federated.dp import DPParams
from tinyproto.federated.party import CountRelease, party_counts
from tinyproto.federated.shards import Shard
from tinyproto.federated.stats import tree_sum


@dataclass(frozen=True)
class RowWise:
    """How a row-wise party function's handles pool: pool(handles) -> one handle of every party's rows in order;
    split(result, handles) -> the pooled result cut into each party's (None: the function is only all-reduced)."""

    pool: Callable[[list], Any]
    split: Callable[[Any, list], list] | None = None


def row_wise(pool: Callable[[list], Any], split: Callable[[Any, list], list] | None = None) -> Callable:
    """Marks a party function as row-wise (see the module docstring); returns it unchanged otherwise."""

    def mark(fn: Callable) -> Callable:
        fn.row_wise = RowWise(pool, split)
        return fn

    return mark


def _row_wise(fn: Callable, handles: list, per_party: Sequence | None, *, derived: bool) -> RowWise | None:
    """fn's RowWise when pooling applies: more than one party, no per-party argument, a split if derived."""
    rows = getattr(fn, "row_wise", None)
    if not isinstance(rows, RowWise) or per_party is not None or len(handles) < 2:
        return None
    return rows if rows.split is not None or not derived else None


class Backend(Protocol):
    """Where the parties run (see the module docstring)."""

    name: str
    handles: list

    @property
    def n_parties(self) -> int: ...

    def describe(self) -> dict: ...

    def derive(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list: ...

    def map(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list: ...

    def run_on(self, party: int, fn: Callable, *args) -> Any: ...

    def allreduce(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> Any: ...

    def allreduce_counts(self, spec: FederatedSpec, dp: DPParams | None,
                         seeds: Sequence[np.random.SeedSequence]) -> CountRelease: ...

    def release(self, handles: list) -> None: ...

    def close(self) -> None: ...


def map_parties(handles: list, fn: Callable, args: tuple, per_party: Sequence | None) -> list:
    """fn(handle_i, *args[, per_party[i]]) for each handle, in order (the same call on any backend)."""
    return [fn(h, *args, *(() if per_party is None else (per_party[i],))) for i, h in enumerate(handles)]


class BackendBase:
    """What every backend shares: the counting round as an all-reduce of `party_counts`, and `with` support."""

    def allreduce_counts(self, spec: FederatedSpec, dp: DPParams | None,
                         seeds: Sequence[np.random.SeedSequence]) -> CountRelease:
        """The counting round: every party's `party_counts` (the host's hash of its int8 rows), summed.
        device_parties.DeviceBackend overrides it: there the devices learn and are read back."""
        return self.allreduce(party_counts, self.handles, spec, dp, per_party=seeds)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalBackend(BackendBase):
    """Every party in this process, one after another: for tests and for the central baseline."""

    name = "local"

    def __init__(self, shards: Sequence[Shard]) -> None:
        self.handles: list = [(np.asarray(X), np.asarray(y)) for X, y in shards]

    @property
    def n_parties(self) -> int:
        return len(self.handles)

    def describe(self) -> dict:
        return {"name": self.name}

    def derive(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        """Per-party state fn(handle, *args[, per_party[i]]) kept where the party is (here: in memory); a row-wise
        fn runs once on the pooled rows and its result is cut into the parties' (views, not copies)."""
        rows = _row_wise(fn, handles, per_party, derived=True)
        if rows is not None:
            return rows.split(fn(rows.pool(handles), *args), handles)
        return self.map(fn, handles, *args, per_party=per_party)

    def release(self, handles: list) -> None:
        pass

    def map(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        """fn(handle_i, *args[, per_party[i]]) for every party, results returned to the coordinator."""
        return map_parties(handles, fn, args, per_party)

    def run_on(self, party: int, fn: Callable, *args) -> Any:
        return fn(self.handles[party], *args)

    def allreduce(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> Any:
        """The exact sum of fn over the parties; a row-wise fn runs once on the pooled rows (the same sum)."""
        rows = _row_wise(fn, handles, per_party, derived=False)
        if rows is not None:
            return fn(rows.pool(handles), *args)
        return tree_sum(self.map(fn, handles, *args, per_party=per_party))


__all__ = ["Backend", "BackendBase", "LocalBackend", "RowWise", "map_parties", "row_wise"]
