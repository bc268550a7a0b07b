"""The tests' fork server (tests/cli_forkserver.py): a `tinyproto` command it serves is what a new interpreter
running `python -m tinyproto` gives (exit status, stdout, stderr, the files written, byte for byte), in the
caller's working directory and environment, with subprocess.run's timeout; and it hands to a new interpreter what
it could not serve faithfully."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

import cli_forkserver
from helpers import ROOT


# What differs between two runs of one compile: the times in the reports (and the manifest's hash of report.json),
# the lock's pid.
TIMED = {"report.html", "report.json", ".tinyproto", ".tinyproto.lock"}


def untimed(value):
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith("_seconds")}
    return [untimed(v) for v in value] if isinstance(value, list) else value


# Under tools/coverage.sh no command is served (a new interpreter runs each, for coverage's sake): a test of what
# the server serves has nothing to test there.
needs_the_server = pytest.mark.skipif(cli_forkserver.measured_by_coverage(os.environ),
                                      reason="coverage.py measures this run: every command runs in a new interpreter")


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env | extra


@pytest.mark.parametrize("args", [
    ["--help"],
    ["compile", "--help"],
    ["boards"],
    ["compile", "no-such-file.csv", "--budget", "1kB"],  # one error line, exit 1
    ["compile", "iris", "--budget", "2 parsecs"],  # click's usage error, exit 2
    ["no-such-verb"],
])
@needs_the_server
def test_a_served_command_answers_as_a_new_interpreter_does(args, tmp_path):
    env = env_with()
    assert cli_forkserver.SERVER.serves(env)  # served, not handed on
    served = cli_forkserver.run(args, cwd=tmp_path, env=env, timeout=120)
    fresh = cli_forkserver.run(args, cwd=tmp_path, env=env, timeout=120, fresh=True)
    assert (served.returncode, served.stdout, served.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert served.args == fresh.args


def test_a_served_compile_writes_what_a_new_interpreter_writes(tmp_path):
    """In the caller's directory (a relative --out) and environment (TINYPROTO_CACHE differs from the server's):
    the same files, byte for byte, as `python -m tinyproto` started afresh."""
    trees = {}
    for name, fresh in (("served", False), ("fresh", True)):
        (tmp_path / name).mkdir()
        env = env_with(TINYPROTO_CACHE=str(tmp_path / name / "cache"))
        result = cli_forkserver.run(["compile", "iris", "--budget", "1kB", "--out", "m"], cwd=tmp_path / name,
                                    env=env, timeout=600, fresh=fresh)
        assert result.returncode == 0, result.stderr
        model = tmp_path / name / "m"
        trees[name] = {p.relative_to(model).as_posix(): p.read_bytes() for p in sorted(model.rglob("*"))
                       if p.is_file() and p.name not in TIMED}
        trees[name]["report.json"] = json.dumps(untimed(json.loads((model / "report.json").read_bytes())))
    assert trees["served"].keys() == trees["fresh"].keys()
    assert [k for k in trees["served"] if trees["served"][k] != trees["fresh"][k]] == []


def test_a_timeout_ends_the_command_as_subprocess_run_does(tmp_path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cli_forkserver.run(["compile", "digits", "--budget", "2kB", "--out", "m"], cwd=tmp_path, env=env_with(),
                           timeout=0.5)
    assert time.monotonic() - started < 60  # killed, not waited for


@needs_the_server
def test_a_start_up_environment_of_its_own_gets_a_server_started_with_it(tmp_path):
    """The locale decides the encoding of Python's streams when an interpreter starts: a child asked for with
    another LC_ALL comes from a server started with it, and prints what a new interpreter under it prints."""
    args = ["compile", "no-such-file-café.csv", "--budget", "1kB"]
    for env in (env_with(LC_ALL="C"), env_with(LC_ALL="C.UTF-8"), env_with()):
        served = cli_forkserver.run(args, cwd=tmp_path, env=env, timeout=120)
        fresh = cli_forkserver.run(args, cwd=tmp_path, env=env, timeout=120, fresh=True)
        assert (served.returncode, served.stdout, served.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
        assert served.returncode == 1
    assert cli_forkserver.SERVER.serves(env_with(TINYPROTO_JOBS="2", TMPDIR="/tmp"))  # read as a command runs
    assert not cli_forkserver.SERVER.serves(env_with(COVERAGE_PROCESS_START="pyproject.toml"))  # coverage's child


def test_the_exit_status_of_a_system_exit_is_pythons():
    assert [cli_forkserver._exit_code(SystemExit(code)) for code in (None, 0, 2, 130, 256 + 3, -1)] == \
        [0, 0, 2, 130, 3, 255]
