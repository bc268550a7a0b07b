#!/usr/bin/env bash
# Line coverage of tinyproto/ over the whole test suite (the README's command), subprocesses included, and its total.
#
#   bash tools/coverage.sh                 the whole suite (as heavy as a run: nice -n 10 on a shared machine)
#   bash tools/coverage.sh tests/test_x.py  any pytest arguments: only those tests
#
# coverage.py (a test extra) runs pytest; its configuration is pyproject.toml's [tool.coverage.*]. `patch =
# subprocess` passes the configuration to every Python process the run starts (pytest-xdist's workers, each
# `tinyproto` command a test runs, the solver's pool, dask's workers) through the environment and coverage's .pth
# file; `_exit`, `execv` and `fork` keep the lines of processes that end by os._exit, exec or fork. The data of
# every process goes to one temporary directory, is combined and reported: per file, then the total. A process
# started without the environment (a test's new virtualenv) is not measured. Extra lines go to $COVERAGE_HTML
# (an HTML report) when it is set. The tests' own exit status is the script's.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import coverage" 2>/dev/null; then
  echo "coverage: coverage.py is missing from .venv; run: bash tools/setup.sh --test" >&2
  exit 2
fi
data=$(mktemp -d "${TMPDIR:-/tmp}/tinyproto-coverage.XXXXXX")
trap 'rm -rf "$data"' EXIT
export COVERAGE_FILE="$data/.coverage"
status=0
.venv/bin/python -m coverage run -m pytest -q "$@" || status=$?
.venv/bin/python -m coverage combine -q "$data"
.venv/bin/python -m coverage report --precision=1 --sort=cover
if [ -n "${COVERAGE_HTML:-}" ]; then
  .venv/bin/python -m coverage html -q --precision=1 -d "$COVERAGE_HTML"
fi
total=$(.venv/bin/python -m coverage report --format=total --precision=1)
echo "line coverage of tinyproto/: $total % (tests exit status $status)"
exit "$status"
