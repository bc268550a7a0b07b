"""The order of a pytest-xdist run (tests/conftest.py): the workers' first runs are balanced by measured time,
longest first and by test file, and tests/durations.json names tests that exist."""

import os
from types import SimpleNamespace

from conftest import DURATIONS, longest_first, measured_durations, runs_of, nonexistent_tests


def test_runs_have_the_sizes_the_worksteal_scheduler_sends():
    assert runs_of(7, 2) == [3, 4]
    assert runs_of(9, 3) == [3, 3, 3]
    assert runs_of(1, 2) == [0, 1]
    assert sum(runs_of(1845, 2)) == 1845


def test_each_run_starts_with_its_longest_files_and_the_runs_are_balanced():
    files = [[1, 1], [40, 1], [30, 2], [25, 1], [20, 1, 1, 1]]  # seconds of each file's tests
    order = longest_first(files, 2)
    assert sorted(order) == [(m, t) for m in range(len(files)) for t in range(len(files[m]))]  # every test once
    first, second = order[:6], order[6:]
    assert [files[m][t] for m, t in first] == [40, 1, 20, 1, 1, 1]  # 64 s
    assert [files[m][t] for m, t in second] == [30, 2, 25, 1, 1, 1]  # 60 s, rather than 75 against 49 in file order
    assert [m for m, _ in first[:2]] == [1, 1] and [m for m, _ in second[:2]] == [2, 2]  # a file's tests together


def test_a_files_longest_test_goes_first_and_one_worker_runs_all_by_length():
    assert longest_first([[1, 5, 3], [2]], 1) == [(0, 1), (0, 2), (0, 0), (1, 0)]


def test_the_runs_get_the_sizes_the_scheduler_sends():
    """A run with too many tests gives its shortest to the next run; one with too few takes the others' last."""
    many_short = [[0.1] * 10, [50.0], [40.0]]
    order = longest_first(many_short, 2)
    assert len(order) == 12 and sorted(order) == sorted(set(order))
    assert order[0] == (1, 0) and order[6] == (2, 0)  # each run still starts with its long file
    assert longest_first([[9.0], [0.1] * 5], 3)[0] == (0, 0)


def test_equal_times_keep_the_collected_order():
    """pytest-randomly's shuffle survives among tests and files of equal expected time."""
    assert longest_first([[0.5] * 3, [0.5] * 3], 2) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert longest_first([[0.5, 0.5, 0.5]], 1) == [(0, 0), (0, 1), (0, 2)]


def test_every_timed_test_exists():
    """A renamed test must leave tests/durations.json too, or its time would be lost from the balance."""
    timed = measured_durations()
    assert timed, f"{DURATIONS.name} is missing or empty (tools/test_durations.py writes it)"
    missing = nonexistent_tests(timed)
    assert not missing, f"{DURATIONS.name} times tests that do not exist: {missing}"


def test_auto_starts_two_workers_per_core_unless_told(monkeypatch):
    from conftest import WORKERS_PER_CORE, pytest_xdist_auto_num_workers

    def run(markexpr: str):
        return pytest_xdist_auto_num_workers(SimpleNamespace(option=SimpleNamespace(markexpr=markexpr)))

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    assert WORKERS_PER_CORE == 2
    assert run("") == run("device") == run("slow") == 2 * cores  # device tests wait
    assert run("not device and not slow") == run("slow and not  device") == cores  # the others compute
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert run("") is None  # pytest-xdist's own hook then returns 3


def test_the_runs_first_process_wrote_the_bytecode_the_workers_read():
    """conftest.compile_bytecode_once: tinyproto's modules and the test modules as pytest rewrites them, compiled
    before the workers start (so no worker rewrites them where PYTHONDONTWRITEBYTECODE is set)."""
    import importlib.util
    from pathlib import Path

    from _pytest.assertion.rewrite import PYC_TAIL

    root = Path(__file__).resolve().parents[1]
    for module in ("__init__.py", "core/folds.py", "families/bnc/train.py"):
        assert Path(importlib.util.cache_from_source(str(root / "tinyproto" / module))).is_file(), module
    here = Path(__file__)
    assert (here.parent / "__pycache__" / (here.name[:-3] + PYC_TAIL)).is_file()
