"""MkDocs hook: the reference pages that are written from the code at build time, so they cannot go stale.

- reference/cli.md        the `--help` of every click command (tinyproto.cli.main)
- reference/c-api.md      the API section of firmware/tinyproto.h: each prototype with the comment above it
- reference/board-files.md  every boards/*.json, its fields from tinyproto.core.boards.Board
- license.md, changelog.md  LICENSE and CHANGELOG.md from the repository root (contributing.md too, when
                            CONTRIBUTING.md exists)

It also adds to the navigation the pages other parts of the project write under docs/ (OPTIONAL_PAGES) once they
exist, so the site never names a page that is missing and never leaves one out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]

# page (relative to docs/) -> (navigation section, title); added to the nav when the file exists
OPTIONAL_PAGES = {
    "guides/verdicts-and-files.md": ("Guides", "Verdicts and your files"),
    "guides/device-loop.md": ("Guides", "The device loop in detail"),
    "guides/choosing-a-model.md": ("Model families", "Choosing a model"),
    "guides/federated-equals-central.md": ("Guides", "Federated equals central"),
    "guides/latency-and-cost-model.md": ("Guides", "Latency and the cost model"),
    "guides/quantization.md": ("Guides", "Quantization"),
    "reference/c-runtime.md": ("Reference", "The C runtime"),
}
# repository file -> (generated page, navigation section, title); the page exists only when the file does
ROOT_PAGES = {
    "LICENSE": ("license.md", "Project", "License"),
    "CHANGELOG.md": ("changelog.md", "Project", "Changelog"),
    "CONTRIBUTING.md": ("contributing.md", "Project", "Contributing"),
}


def _nav_section(nav: list, title: str) -> list:
    for entry in nav:
        if isinstance(entry, dict) and title in entry:
            return entry[title]
    section: list = []
    nav.append({title: section})
    return section


def _nav_pages(nav) -> set[str]:
    pages: set[str] = set()
    for entry in nav if isinstance(nav, list) else [nav]:
        if isinstance(entry, str):
            pages.add(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def on_config(config):
    nav = config["nav"]
    present = _nav_pages(nav)
    docs = Path(config["docs_dir"])
    for page, (section, title) in OPTIONAL_PAGES.items():
        if (docs / page).is_file() and page not in present:
            _nav_section(nav, section).append({title: page})
    for source, (page, section, title) in ROOT_PAGES.items():
        if (ROOT / source).is_file() and page not in present:
            _nav_section(nav, section).append({title: page})
    for bench in sorted((docs / "benchmarks").glob("*.md")):  # the pages tools/bench_docs.py wrote
        page = f"benchmarks/{bench.name}"
        if page not in present and bench.name != "index.md":
            title = bench.read_text().splitlines()[0].lstrip("# ").strip()
            _nav_section(nav, "Benchmarks").append({title: page})
    return config


# ---- the command line ----------------------------------------------------------------------------------------

def _command_help(command: click.Command, path: str, parent: click.Context | None = None) -> str:
    settings = {"terminal_width": 100, "max_content_width": 100, **command.context_settings}
    with click.Context(command, info_name=path, parent=parent, **settings) as context:
        return command.get_help(context)


def cli_page() -> str:
    from tinyproto.cli import main

    out = ["# Command line", "",
           "Generated from the click commands at build time (`tinyproto COMMAND --help` prints the same).", "",
           "```text", _command_help(main, "tinyproto"), "```", ""]
    root = click.Context(main, info_name="tinyproto", **main.context_settings)
    for name in sorted(main.commands):
        command = main.commands[name]
        out += [f"## tinyproto {name}", "", "```text", _command_help(command, name, root), "```", ""]
    return "\n".join(out)


# ---- the C API -------------------------------------------------------------------------------------------------



def _comment_text(body: str) -> str:
    lines = [re.sub(r"^\s*\*? ?", "", line) for line in body.strip("*").splitlines()]
    return "\n".join(lines).strip()


def _api_blocks(api: str) -> list[tuple[str, list[str]]]:
    """(comment, code lines) pairs: each block comment of the header with the declarations right after it."""
    blocks: list[tuple[str, list[str]]] = []
    lines = api.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("/*"):
            i += 1
            continue
        comment = [lines[i]]
        while "*/" not in comment[-1]:
            i += 1
            comment.append(lines[i])
        i += 1
        code = []
        while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith("/*"):
            code.append(lines[i].rstrip())
            i += 1
        blocks.append((_comment_text("\n".join(comment).strip()[2:-2]), code))
    return blocks


def c_api_page() -> str:
    header = (ROOT / "firmware" / "tinyproto.h").read_text()
    api = header[header.index("/* ---- The C API"):header.rindex("#ifdef __cplusplus")]
    out = ["# C API", "",
           "Generated at build time from `firmware/tinyproto.h`, the header every generated project includes. "
           "The model's sizes (`TP_N_FEATURES`, `TP_N_CLASSES`, `TP_STREAMABLE`, ...) are defined by the "
           "generated `include/tinyproto_model.h`; `tinyproto export DIR --arduino` writes a `<Name>.h` with the "
           "exact figures of one model.", ""]
    for text, code in _api_blocks(api):
        if text.startswith("----"):
            first, _, rest = text.partition("\n")
            out += [f"## {first.strip('- ').split('(')[0].strip()}", "", _literal_or_prose(rest), ""]
            code_text = "\n".join(code)
            if code_text:
                out += ["```c", code_text, "```", ""]
            continue
        if code:
            out += ["```c", "\n".join(code), "```", ""]
        out += [text, ""]
    return "\n".join(out)


def _literal_or_prose(text: str) -> str:
    """Indented lines of the header's comment are C examples: they become a code block."""
    out, code = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("  ") and line.strip():
            code.append(line[2:])
            continue
        if code:
            out += ["```c", *code, "```"]
            code = []
        out.append(line)
    return "\n".join(out).strip() + "\n"


# ---- board files -------------------------------------------------------------------------------------------------

def board_files_page() -> str:
    boards = [json.loads(p.read_text()) for p in sorted((ROOT / "boards").glob("*.json"))]
    columns = ["name", "mcu", "f_cpu_hz", "voltage_v", "sram_bytes", "flash_bytes_for_sketch", "eeprom_bytes",
               "serial_baud", "pio_board", "fqbn"]
    out = ["# Board files", "",
           "Generated at build time from `boards/*.json` (what `--board NAME` reads; `tinyproto boards --json` "
           "prints the same). A board is a name, never a path. See the [boards guide](../guides/boards.md) for "
           "how the board flows through compile, build and validate.", "",
           "| " + " | ".join(columns + ["upload"]) + " |", "|" + "---|" * (len(columns) + 1)]
    for board in boards:
        upload = board.get("upload", {})
        cells = [str(board.get(c, "")) for c in columns]
        cells.append(f"{upload.get('protocol', '')} @ {upload.get('speed', '')}, {upload.get('bootloader', '')}")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "## Fields", "",
            "Every file has the same fields (the currents cite their source in the `*_source` fields):", "",
            "```json", json.dumps(boards[0], indent=2), "```", ""]
    return "\n".join(out)


# ---- the serial protocol ----------------------------------------------------------------------------------------

_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = ([^#\n]+?)[ \t]*(?:#[ \t]*(.*))?$", re.MULTILINE)


def _constants(path: Path, prefix: str = "") -> list[tuple[str, str, str]]:
    return [(name, value.strip(), (comment or "").strip())
            for name, value, comment in _CONSTANT.findall(path.read_text()) if name.startswith(prefix)]


def serial_protocol_page() -> str:
    design = (ROOT / "docs" / "design.md").read_text()
    start = design.index("## Serial protocol")
    end = design.index("\n## ", start + 3)
    section = design[start:end].replace("## Serial protocol", "## Frames and messages", 1)
    out = ["# Serial protocol", "",
           "Generated at build time: the message description from [the design notes](../design.md), and the "
           "constants from the code that both sides are built from (`tinyproto/core/wire.py`, written into every "
           "project's `include/tinyproto_sizes.h`; the message and error codes of `tinyproto/device/codec.py`).",
           "", section.strip(), "",
           "## Sizes shared by host and device (`tinyproto/core/wire.py`)", "", "| name | value | meaning |",
           "|---|---|---|"]
    out += [f"| `{n}` | `{v}` | {c} |" for n, v, c in _constants(ROOT / "tinyproto" / "core" / "wire.py")]
    out += ["", "## Message and error codes (`tinyproto/device/codec.py`)", "", "| name | value | note |",
            "|---|---|---|"]
    codec = ROOT / "tinyproto" / "device" / "codec.py"
    out += [f"| `{n}` | `{v}` | {c} |" for n, v, c in _constants(codec) if n.startswith(("MSG_", "ERR_"))]
    return "\n".join(out) + "\n"


# ---- pages from the repository root --------------------------------------------------------------------------

def _root_page(source: str, title: str) -> str:
    text = (ROOT / source).read_text()
    if source == "LICENSE":
        return f"# {title}\n\n```text\n{text}```\n"
    # the root files link to docs/ with repository paths; on the site those pages are siblings
    return re.sub(r"\]\(docs/", "](", text)


def on_files(files, config):
    generated = {
        "reference/cli.md": cli_page(),
        "reference/c-api.md": c_api_page(),
        "reference/board-files.md": board_files_page(),
        "reference/serial-protocol.md": serial_protocol_page(),
    }
    for source, (page, _section, title) in ROOT_PAGES.items():
        if (ROOT / source).is_file():
            generated[page] = _root_page(source, title)
    for page, content in generated.items():
        existing = files.get_file_from_path(page)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, page, content=content))
    return files
