"""The documentation stays true: the site builds with warnings as errors (links and anchors checked), the README
keeps its shape, and every command a page shows WITH its output is run again and compared line by line, figures
included (the rules of an executed example, and `--update`, are in tools/docs_examples.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
from docs_examples import (  # noqa: E402 (tools/ goes on the path first)
    EXECUTED_PAGES, PAGE_GROUPS, WINE_PAGE, comparable, console_blocks, example_runner, exit_of, is_excerpt,
    missing_lines, normalise, page_commands, prerequisites, stale_lines, unshown_lines)

# every page where a console block showing output must be executed
MUST_RUN = ["README.md", "docs/getting-started.md", "docs/tutorials/*.md"]
SETUP_LINES = ("bash tools/setup.sh && .venv/bin/tinyproto run --budget 2kB",
               "bash tools/setup.sh --test && .venv/bin/python -m pytest -q")


def _pages(patterns: list[str]) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        found += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))
    return found


# ---- fast checks ------------------------------------------------------------------------------------------------

def test_normalise_masks_wall_seconds():
    assert normalise("search time │ 81.52 s (12 candidates)") == normalise("search time │ 5.48 s (12 candidates)")
    assert normalise("latency 1.366 ms at 16 MHz") != normalise("latency 1.367 ms at 16 MHz")


def test_normalise_masks_the_run_dependent_stack_peak_but_not_static_sram():
    measured = "│ SRAM │ static 458 B + stack peak {} B, margin {} B │"
    assert normalise(measured.format(136, 1454)) == normalise(measured.format(126, 1464))
    assert normalise("static 458 B + stack peak 136 B") != normalise("static 459 B + stack peak 136 B")
    assert normalise("model data 2032 B") != normalise("model data 2033 B")
    assert missing_lines(["│ total │ 2048 │"], "a\n│  total  │  2048  │\n") == []
    assert missing_lines(["│ total │ 2047 │"], "│ total │ 2048 │\n") == ["│ total │ 2047 │"]
    assert missing_lines(["b", "a"], "a\nb\n") == ["a"]  # order matters


def test_a_page_showing_a_whole_output_leaves_no_line_of_it_out():
    listing = "lib\ntp_judge.c\ntp_judge_avr.h\n"
    assert unshown_lines(["lib", "tp_judge.c"], listing) == ["tp_judge_avr.h"]
    assert unshown_lines(["lib", "tp_judge.c", "tp_judge_avr.h"], listing + "\n  ━━━━ 30/30\n") == []
    assert is_excerpt("$ tinyproto run --budget 2kB   # (excerpt)")
    assert not is_excerpt("$ ls build/wine-arduino")
    assert not is_excerpt("$ grep '(excerpt)' notes.txt")


def test_a_refusal_on_a_page_states_its_exit_status(tmp_path):
    assert exit_of("$ tinyproto run bad.csv     # (exits 1)") == 1
    assert exit_of("$ tinyproto run wine.csv     # (excerpt)") == 0
    assert exit_of("$ echo '(exits 1)'") == 0  # only in the comment
    run = example_runner(tmp_path)
    assert run("echo refused; exit 1", 1) == "refused\n"
    with pytest.raises(RuntimeError, match="exited 0, the page says 1"):
        run("echo fine", 1)
    with pytest.raises(RuntimeError, match="exited 2, the page says 0"):
        run("exit 2")


def test_readme_is_short_and_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    first_block = readme.split("```")[1]
    assert [line for line in first_block.splitlines() if line.strip()] == list(SETUP_LINES)
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP_LINES[1] in ci  # CI runs the README's test command


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets
    for target in targets:
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_no_session_history_in_the_docs():
    pattern = re.compile(r"\bsession \d|\bissue \d+|\bload average|known gaps", re.IGNORECASE)
    for page in ["README.md", *_pages(["docs/**/*.md"])]:
        for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
            assert not pattern.search(line), f"{page}:{number}: {line.strip()}"


def test_the_pages_state_the_int8_loss_warning_threshold_the_code_uses():
    """compile warns above INT8_LOSS_WARNING_POINTS; a page saying another threshold sends a reader looking for a
    warning that is not there (quantization.md said "more than a point" while the code warns above half)."""
    from tinyproto.pipeline.compile import INT8_LOSS_WARNING_POINTS

    words = {0.5: "half a point", 1.0: "a point"}[INT8_LOSS_WARNING_POINTS]
    statement = re.compile(r"(?:warns when int8 is|int8 model \(what the device runs\) gets) more than "
                           r"((?:half )?a point)")
    stated = []
    for page in ["README.md", *_pages(["docs/**/*.md"])]:
        text = " ".join((ROOT / page).read_text().split())
        stated += [(page, found) for found in statement.findall(text)]
    assert stated, "no page states the threshold of compile's int8 loss warning"
    assert all(found == words for _, found in stated), stated


@pytest.mark.parametrize("page", _pages(MUST_RUN))
def test_every_example_with_output_is_executed(page):
    for marked, steps in console_blocks(page):
        shows_output = any(any(comparable(line) for line in step.expected) for step in steps)
        assert marked or not shows_output, f"{page}: a console block shows output but has no <!-- run --> marker"
        if marked:
            assert page in EXECUTED_PAGES, f"{page} has executed examples: add it to EXECUTED_PAGES"


def test_site_builds_strict(tmp_path):
    """mkdocs build --strict: a broken internal link or anchor, a page missing from the nav, a generated
    reference page that fails: every warning is an error."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    cli = (site / "reference" / "cli.html").read_text()
    assert "tinyproto compile" in cli and "--budget" in cli  # generated from the click commands
    assert "tp_predict" in (site / "reference" / "c-api.html").read_text()  # generated from firmware/tinyproto.h
    assert "fit_under_budget" in (site / "reference" / "python-api.html").read_text()  # from the docstrings


# ---- the executed examples ----------------------------------------------------------------------------------------

def documented_keys(section: str) -> set[str]:
    """The keys in the first column of the table under `## <section>` of the file-formats page."""
    text = (DOCS / "reference" / "file-formats.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            keys |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return keys


FILE_FORMATS = {"model.json": "model.json", "report.json": "report.json", "build.json": "build.json",
                "validation.json": "validation.json", "The manifest (.tinyproto)": ".tinyproto"}


def test_the_page_groups_are_the_executed_pages_in_order():
    assert [page for group in PAGE_GROUPS for page in group] == EXECUTED_PAGES
    wine = page_commands(WINE_PAGE)[0]
    assert "savetxt('wine.csv'" in wine  # the command prerequisites() runs for the later tutorials
    assert prerequisites(["docs/tutorials/federated.md"]) == [wine]
    assert prerequisites(["docs/tutorials/own-csv.md", "docs/tutorials/arduino-sketch.md"]) == []
    assert prerequisites(["docs/tutorials/two-models.md"]) == []


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("group", PAGE_GROUPS, ids=lambda group: Path(group[0]).stem)
def test_executed_pages_match_a_fresh_run(tmp_path, group):
    """One test per group of pages, each in a directory of its own, so that pytest-xdist's workers share them: a
    group runs its own commands (and the one that writes wine.csv where it reads it without making it)."""
    run = example_runner(tmp_path)
    for command in prerequisites(group):
        run(command)
    stale = stale_lines(run, group)
    if WINE_PAGE in group:
        # the file-formats reference lists exactly the top-level keys of the model directory the tutorial made
        for section, name in FILE_FORMATS.items():
            actual = set(json.loads((tmp_path / "build" / "wine" / name).read_text()))
            if documented_keys(section) != actual:
                stale.append(f"docs/reference/file-formats.md, {section}: documented "
                             f"{sorted(documented_keys(section))}, the file has {sorted(actual)}")
    assert not stale, "stale documentation (`python tools/docs_examples.py --update` rewrites the figures):\n" + \
        "\n".join(stale)
