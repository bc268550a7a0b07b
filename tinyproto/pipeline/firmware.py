"""Build a model directory's firmware and record it (build.json: sizes, the ELF's sha256 and the model hash it
was built from, which validate checks). Used by `tinyproto build`, `run`, `learn` (the learned model) and
`sweep`; a library function, below the CLI.
Layer: pipeline."""

from __future__ import annotations

from pathlib import Path

from tinyproto.core.errors import TinyprotoError
from tinyproto import families


def build_model_dir(path: Path, env: str | None, console) -> dict:
    """Build the model directory's PlatformIO project and record the result in build.json; env None: the
    project's default environment (`<board>_sim`)."""
    from tinyproto.core.modeldir import load_model_dir, record_outputs
    from tinyproto.core.outdir import locked

    model_dir = load_model_dir(path)
    with locked(model_dir.path, "build"):
        record_outputs(model_dir.path, ".pio", "build.json")
        return _build_locked(model_dir, env, console)


def _build_locked(model_dir, env: str | None, console) -> dict:
    from tinyproto.core.boards import load_board
    from tinyproto.device.build import build_project
    from tinyproto.pipeline.validate import header_model_hash
    from tinyproto.core.modeldir import check_project_files, file_sha256, write_json

    board = load_board(model_dir.meta.get("board", "uno"))
    model = families.load_int_model(model_dir)  # refuses an edited or damaged model.json before any build
    check_project_files(model_dir.path)
    _check_header_is_the_model(model_dir, model)
    built_hash = header_model_hash(model_dir.path)
    if built_hash != model_dir.meta["model_hash"]:
        raise TinyprotoError(f"{model_dir.path}/include/tinyproto_model.h does not hold the model of model.json "
                             f"({built_hash} vs {model_dir.meta['model_hash']}); run `tinyproto compile` again")
    if not (model_dir.path / "include" / "tinyproto_sizes.h").is_file():  # compiled before streamed frames
        raise TinyprotoError(f"{model_dir.path}/include/tinyproto_sizes.h is missing (the directory predates "
                             f"protocol version 2); run `tinyproto compile` again")
    from tinyproto.device.build import resolve_env

    env = resolve_env(model_dir.path, env)
    with console.status(f"building {model_dir.path} ({env})...", spinner="dots"):
        result = build_project(model_dir.path, env=env)
    sizes = result.sizes
    root = model_dir.path.resolve()
    info = {
        "env": env,
        "tool": result.tool,
        "elf": str(result.elf.relative_to(root) if result.elf.is_absolute() else result.elf),
        "hex": str(result.hex.relative_to(root) if result.hex.is_absolute() else result.hex),
        "firmware_sha256": file_sha256(result.elf),
        "model_hash": built_hash,
        "flash_bytes": sizes.flash_bytes,
        "text_bytes": sizes.text_bytes,
        "data_bytes": sizes.data_bytes,
        "bss_bytes": sizes.bss_bytes,
        "sram_static_bytes": sizes.sram_static_bytes,
        "flash_available_bytes": board.flash_bytes_for_sketch,
        "sram_bytes": board.sram_bytes,
        "model_bytes": model_dir.report.get("model_bytes"),
    }
    if sizes.flash_bytes > board.flash_bytes_for_sketch:
        raise TinyprotoError(f"firmware needs {sizes.flash_bytes} B of flash; {board.title} has {board.flash_bytes_for_sketch} B")
    if sizes.sram_static_bytes >= board.sram_bytes - board.sram_reserved_bytes:
        raise TinyprotoError(
            f"firmware's static SRAM ({sizes.sram_static_bytes} B) leaves less than {board.sram_reserved_bytes} B "
            f"of {board.sram_bytes} B for the stack"
        )
    write_json(model_dir.path / "build.json", info)
    return info


def _header_body(text: str) -> str:
    """The generated header from its include guard on: the defines and arrays (the banner names the version)."""
    start = text.find("#ifndef TINYPROTO_MODEL_H")
    return text[start:] if start >= 0 else text


def _check_header_is_the_model(model_dir, model) -> None:
    """include/tinyproto_model.h must be exactly what model.json renders (defines and every array value): a
    header edited by hand would otherwise be built, and only the vectors it happens to change would show it."""
    from tinyproto.core.modeldir import read_text_file
    from tinyproto.core.render import render_header

    meta = model_dir.meta
    path = model_dir.path / "include" / "tinyproto_model.h"
    on_disk = read_text_file(path, "the generated header", limit=1 << 24)
    try:
        expected = render_header(model, str(meta.get("dataset", "?")), int(meta.get("seed", 0)),
                                 int(meta.get("budget_bytes", 0)))
    except (TypeError, ValueError):
        raise TinyprotoError(f"{model_dir.path / 'model.json'} is damaged: seed / budget_bytes are not numbers") from None
    if _header_body(on_disk) != _header_body(expected):
        raise TinyprotoError(f"{path} is not what model.json renders (edited after compile?); run `tinyproto "
                             "compile` again, or edit the model through tinyproto, not the header")
