"""Federated FlyNN with parties that learn on a device: `tinyproto federate --backend sim|port`.

Each party is one Uno (simulated: its own simavr process and pty; real: one serial port) running the FlyNN
*learning* firmware, the same firmware `tinyproto learn` builds (device_learning.py). Everything before the
counting (classes, standardisation, int8 step, hyper-parameters) is computed by the party's host side exactly as
with `LocalBackend`; the counting round is the device's:

1. the agreed configuration, classes and input stage make a model without counts (all zero); its learning
   firmware is built once (`check_learnable` first: the configuration was chosen with `count_limit`, so it fits);
2. every party starts its device (the simulator; with --ports the board is flashed), checks the handshake (this
   model's hash, learning firmware), CLEARs it, streams ITS OWN shard as int8 vectors (the agreed input stage)
   with class indices in LEARN frames, and reads the packed counts back with READ_COUNTS;
3. those device counts (saturated on the device to 2^bits - 1) are what the party releases; with DP the party's
   host applies the release (`dp_release`) after reading them -- the device itself adds no noise;
4. the all-reduce sums them and the model saturates the sum again. min(Σ min(c_p, cap), cap) = min(Σ c_p, cap),
   so the deployed counts equal those of the local backend and of central training exactly; the unsaturated
   sums (and the float model's counts, which a device does not compute) are not comparable and not released.

Each party also checks its device against the host reference (`host_counts`, the integer FlyHash of the same
int8 rows, saturated); the report lists that per party. Parties run a few at a time (threads; each device is
its own process or port).

Layer: federated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from tinyproto.core.boards import Board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.measured import cycle_problem
from tinyproto.core.outdir import private_scratch
from tinyproto.core.render import model_hash
from tinyproto.families.flynn.learning import check_learnable, host_counts, unpack_counts
from tinyproto.federated.config import FederatedSpec, assemble
from tinyproto.federated.device_learning import (
    LEARN_FLAGS, Target, build_learning_firmware, check_learning_device, class_indices, stream_samples,
    write_learning_project,
)
from tinyproto.federated.dp import DPParams, dp_release
from tinyproto.federated.local_parties import LocalBackend
from tinyproto.federated.party import CountRelease
from tinyproto.federated.stats import tree_sum

MAX_PARALLEL = 4  # devices learning at the same time


def check_ports(ports: Sequence[str], n_parties: int) -> list[str]:
    """One existing serial port per party, refused before any data is read."""
    ports = [p.strip() for p in ports if p.strip()]
    if len(ports) != n_parties:
        raise TinyprotoError(f"--ports lists {len(ports)} port(s) for {n_parties} parties: give one port per party")
    if len(set(ports)) != len(ports):
        raise TinyprotoError("--ports lists a port twice: every party needs its own board")
    from tinyproto.device.port_checks import check_port_usable

    for port in ports:
        check_port_usable(port)  # missing, not a tty, not openable, held: refused before the firmware's build
    return ports


class DeviceBackend(LocalBackend):
    """Parties whose counts are learned by a device: simulated Unos (ports=None) or real boards on `ports`."""

    def __init__(self, shards, board: Board, ports: Sequence[str] | None = None, *, dataset: str = "federated",
                 budget_bytes: int = 0, parallel: int = MAX_PARALLEL,
                 progress: Callable[[str], None] | None = None) -> None:
        super().__init__(shards)
        self.ports = check_ports(ports, len(self.handles)) if ports is not None else None
        self.name = "sim" if self.ports is None else "port"
        self.board = board
        self.dataset = dataset
        self.budget_bytes = int(budget_bytes)
        self.parallel = max(1, int(parallel))
        self.say = progress or (lambda message: None)
        self.party_reports: list[dict] = []
        self.firmware: dict | None = None
        # the learning project and its build: a locked private scratch, so one a SIGKILL leaves is removed by the
        # next run (a plain TemporaryDirectory would stay in $TMPDIR for ever)
        self._scratch = private_scratch("tinyproto-federate-")
        self._workdir = self._scratch.__enter__()

    def describe(self) -> dict:
        return {"name": self.name, "devices": len(self.handles), "ports": self.ports, "firmware": self.firmware,
                "device_parties": self.party_reports}

    def allreduce_counts(self, spec: FederatedSpec, dp: DPParams | None,
                         seeds: Sequence[np.random.SeedSequence]) -> CountRelease:
        L, m = len(spec.classes), spec.config.n_hashes
        _, blank = assemble(spec, np.zeros((L, m), np.int64), np.zeros((L, m), np.int64))  # the model, no counts
        sizes = check_learnable(blank, self.board, save_eeprom=False)
        project = write_learning_project(Path(self._workdir) / "learning", blank, self.board, self.dataset,
                                         spec.config.seed, self.budget_bytes)
        self.say(f"building the learning firmware ({sizes.counts} B of counts in SRAM)")
        firmware = build_learning_firmware(project, blank, self.board, sizes, self.say)
        if self.ports is not None:
            from tinyproto.device.flash import flash_port

            for port in self.ports:
                self.say(f"flashing {port} with the learning firmware")
                flash_port(self.board, port, firmware.hex)
        self.firmware = {"flash_bytes": firmware.flash_bytes, "sram_static_bytes": firmware.sram_static_bytes,
                         "count_bytes": sizes.counts, "flags": list(LEARN_FLAGS), "tool": firmware.tool,
                         "model_hash": f"0x{model_hash(blank):08X}"}
        expected_hash = model_hash(blank)

        def one(i: int) -> tuple[np.ndarray, dict]:
            return self._learn_party(i, blank, expected_hash, firmware.elf, spec)

        pool = ThreadPoolExecutor(max_workers=min(self.parallel, len(self.handles)))
        try:
            learned = list(pool.map(one, range(len(self.handles))))
        finally:  # on an error or Ctrl-C: no new party starts; those learning end within the protocol's timeouts
            pool.shutdown(wait=True, cancel_futures=True)
        self.party_reports = [report for _, report in learned]
        releases = []
        for (counts, _), seed_seq in zip(learned, seeds):
            released = counts if dp is None else dp_release(counts, dp, np.random.default_rng(seed_seq))
            releases.append(CountRelease(np.asarray(released, dtype=np.int64), None))  # no float counts on a device
        return tree_sum(releases)

    def _learn_party(self, i: int, blank, expected_hash: int, elf: Path,
                     spec: FederatedSpec) -> tuple[np.ndarray, dict]:
        """Party i: its device learns its shard; returns (the device's counts, what the party reports)."""
        X, y = self.handles[i]
        xq = spec.input_stage().quantize(X)  # the agreed int8 input stage
        y_index = class_indices(blank, y)
        target = Target(None if self.ports is None else self.ports[i], None, self.board.boot_quiet_s)
        started = time.monotonic()
        with ExitStack() as stack:
            client = target.open(stack, elf, self.board.serial_baud)
            check_learning_device(client.info, expected_hash, blank.n_features, blank.n_classes)
            cycles = stream_samples(client, xq, y_index, None)
            counts = unpack_counts(client.read_all_counts(), blank)
        expected = host_counts(blank, xq, y_index)
        identical = bool(np.array_equal(counts, expected))
        # a figure the device reports is checked before it is averaged (core/measured.py): 0 cycles, a wrapped or
        # saturated count is no measurement, left out (null) and named; the command then exits non-zero
        cycles_bad = cycle_problem(cycles) if cycles else None
        self.say(f"party {i}: {target.name} learned {len(xq)} rows, counts {'=' if identical else '!='} host "
                 f"reference ({time.monotonic() - started:.1f} s)")
        return counts, {
            "party": i,
            "target": target.name,
            "n_samples": int(len(xq)),
            "counts_identical_to_host": identical,
            "count_entries_differing": int(np.count_nonzero(counts != expected)),
            "entries_at_cap": int(np.count_nonzero(counts == (1 << blank.bits) - 1)),
            "learn_cycles_mean": float(np.mean(cycles)) if cycles and cycles_bad is None else None,
            "device_figure_problems": [cycles_bad] if cycles_bad else [],
            "seconds": round(time.monotonic() - started, 2),
        }

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.__exit__(None, None, None)
            self._scratch = None


__all__ = ["DeviceBackend", "check_ports"]
