"""`tinyproto export DIR --arduino`: the model of a model directory as an Arduino library (+ a .zip of it).

    OUT/                      (default: <model dir>-arduino; written atomically, see tinyproto.core.modeldir)
      <Name>/                 the library, as the Arduino IDE / arduino-cli / PlatformIO expect it
        library.properties
        src/<Name>.h          the one header a sketch includes: the C API, per-model SRAM and cost figures
        src/tinyproto_model.h the model (PROGMEM arrays + #defines), the same header `compile` generated
        src/tinyproto.h, tp_avr.h, tp_input.c, tp_judge.c, tp_judge_avr.h, tp_<family>.c, tp_<family>_avr.h
                              the runtime (not the device app tp_main.c: the sketch is the app)
        src/tp_labels.c       the class names in flash
        src/tp_text.c/.h      tp_parse_float: decimal text -> float32, correctly rounded (avr-libc's strtod is not)
        examples/<Name>/<Name>.ino   reads one vector per Serial line, prints the class, its score and confidence
      <Name>.zip              the same folder for the IDE's Sketch > Include Library > Add .ZIP Library
      platformio.ini          PlatformIO, framework = arduino: the example against the library, offline
                              (<board>_offline, Debian's Arduino core) or official (<board>); see the file

The model directory stays the single source: the header is rendered from model.json (verified), never copied.
Layer: pipeline.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path


from tinyproto.core.version import __version__
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.render import check_prefix
from tinyproto.core.resources import resource_dir
from tinyproto.core.safe_io import resolved
from tinyproto import families

NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
LIBRARY_EXTRAS = ("tp_text.h", "tp_text.c")  # templates/arduino/: the correctly rounded text -> float32 reader
# Names the library's own files already use (the IDE runs on case-insensitive file systems too).
_FIXED_NAMES = {"tp_text", "tinyproto", "tinyproto_model", "tp_labels", "arduino"}


def _taken_names() -> set[str]:
    """File names of the library: the fixed ones and every runtime file shipped (firmware/*.c, *.h)."""
    return _FIXED_NAMES | {path.stem.lower() for path in resource_dir("firmware").iterdir()}
# tp_input_quantize on an ATmega328P: 65,041-65,344 cycles for 64 features (simulated Uno, cycle-exact).
QUANTIZE_CYCLES_PER_FEATURE = 1020
EXPORT_RECORD = "export.json"  # in OUT: says this directory is an export (and of which model)
EXPORT_FORMAT = "tinyproto-arduino-library"
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed: the same model gives the same zip


@dataclass(frozen=True)
class ArduinoExport:
    out_dir: Path
    library_dir: Path
    zip_path: Path
    name: str


def library_name(dataset: str) -> str:
    """'breast_cancer' -> 'TinyprotoBreastCancer': a valid Arduino library name and C identifier."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", dataset) if p]
    name = "Tinyproto" + "".join(p[:1].upper() + p[1:] for p in parts)
    return name[:63]


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise TinyprotoError(f"--name {name!r} is not usable: a library name here is a C identifier of at most 63 "
                             "characters (a letter, then letters, digits or _)")
    if name.lower() in _taken_names():
        raise TinyprotoError(f"--name {name!r} would clash with a file of the library; choose another name")
    return name


def c_string(text: str) -> str:
    """A C string literal of `text` (UTF-8), safe for any content: octal escapes, no trigraphs."""
    out = []
    for byte in str(text).encode("utf-8"):
        char = chr(byte)
        if 0x20 <= byte < 0x7F and char not in '"\\?':
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _template(name: str):
    from tinyproto.core.render import jinja_env

    return jinja_env().get_template(f"arduino/{name}")


def _context(model_dir, model, name: str, board, prefix: str) -> dict:
    """Everything the templates say; `board` (the one the model was compiled for) gives the clock of every time,
    `prefix` the model's C names."""
    meta, report = model_dir.meta, model_dir.report
    dataset, _, budget_bytes = model_dir.header_args()  # typed by load_model_dir
    return {
        "name": name,
        "prefix": prefix,
        "prefix_upper": prefix.upper(),
        "guard": re.sub(r"[^A-Z0-9]", "_", name.upper()) + "_H",
        "version": __version__,
        "dataset": dataset,
        "dataset_comment": re.sub(r"[^\x20-\x7e]|\*/", "?", dataset),
        "model_hash": meta["model_hash"],
        "model_bytes": sum(a.nbytes for a in model.carrays()),
        "budget_bytes": budget_bytes,
        "n_features": model.n_features,
        "n_classes": model.n_classes,
        **family_statements(model),
        **latency_statements(model, report, board),
        "cost": library_cost(model, board),
        "class_names": [c_string(c) for c in model.classes],
        "class_comments": [re.sub(r"[^\x20-\x7e]|\*/", "?", str(c)) for c in model.classes],
    }


def family_statements(model) -> dict:
    """What the library says about the model's family, from the family's declared facts (never from its name):
    which score wins and what a score is, the static state its runtime keeps, reentrancy, streaming."""
    fam = families.family_of(model)
    state = fam.static_state(model)
    # the clip check's count (tp_judge.c), which tp_predict writes when the model has the check
    state = replace(state, predict=state.predict + families.judge_static(model))
    static_names = {item.name for item in state.items}
    # tp_predict's own stack buffers (the input vector and the scores are the caller's, listed apart)
    stack = [(item.name, item.nbytes, item.what) for item in model.working_sram()
             if item.name not in ("input", "scores") and item.name not in static_names]
    return {
        "family": model.family,
        "family_title": fam.title,
        "family_macro": f"TP_FAMILY_{model.family.upper()}",
        "score_wins": fam.score.wins,
        "score_meaning": fam.score.meaning,
        "stack": stack,
        "stack_total": sum(n for _, n, _ in stack),
        "static": [(item.name, item.nbytes, item.what) for item in state.items],
        "static_bytes": state.nbytes,
        "static_predict_bytes": sum(item.nbytes for item in state.predict),
        "reentrant": state.reentrant,
        "streamable": bool(model.defines().get("TP_STREAMABLE", 0)),
    }


def library_cost(model, board) -> dict | None:
    """The library's own flash and SRAM in a sketch, measured by building it (device/library_cost.py), or None
    where avr-gcc is not installed (the header then says so)."""
    import shutil

    from tinyproto.device.library_cost import measure_library

    if shutil.which("avr-gcc") is None or shutil.which("avr-size") is None:
        return None
    return measure_library(model, board).to_dict()


def latency_statements(model, report: dict, board) -> dict:
    """Cycles (the family's cost model, from report.json) and milliseconds at the board's own clock."""
    cycles = report.get("predicted_cycles") or {}
    total = cycles.get("total") if isinstance(cycles, dict) else None
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not 0 < total < 2**53:
        total = None  # report.json is not hashed: a figure it cannot hold (inf, NaN, text) is left out, not trusted
    cycles_per_ms = board.f_cpu_hz / 1000.0
    quantize_cycles = QUANTIZE_CYCLES_PER_FEATURE * model.n_features
    return {
        "board_title": board.title,
        "mhz": f"{board.mhz:g}",
        "predict_cycles": int(total) if total is not None else None,
        "predict_ms": round(int(total) / cycles_per_ms, 2) if total is not None else None,
        "quantize_us_per_feature": round(QUANTIZE_CYCLES_PER_FEATURE / cycles_per_ms * 1000.0),
        "quantize_cycles": quantize_cycles,
        "quantize_ms": round(quantize_cycles / cycles_per_ms, 2),
    }


def library_header(model_dir, model, name: str, board, prefix: str | None = None) -> str:
    """src/<Name>.h: the one header a sketch includes, with the model's figures at `board`'s clock."""
    return _template("library.h.j2").render(**_context(model_dir, model, name, board, prefix or model_dir.prefix))


def write_library(model_dir, model, name: str, library: Path, board, prefix: str | None = None) -> None:
    """The library folder `library` (must not exist) for the verified integer model of `model_dir`, its C names
    under `prefix` (default: the one it was compiled with)."""
    from tinyproto.core.render import MODEL_RUNTIME, family_runtime, family_twins, render_header, runtime_files
    from tinyproto.core.resources import resource_dir

    prefix = prefix or model_dir.prefix
    context = _context(model_dir, model, name, board, prefix)
    src = library / "src"
    example = library / "examples" / name
    src.mkdir(parents=True)
    example.mkdir(parents=True)
    (library / "library.properties").write_text(_template("library.properties.j2").render(**context), encoding="utf-8")
    (src / f"{name}.h").write_text(library_header(model_dir, model, name, board, prefix), encoding="utf-8")
    (src / "tp_labels.c").write_text(_template("tp_labels.c.j2").render(**context), encoding="utf-8")
    (src / "tinyproto_model.h").write_text(
        render_header(model, *model_dir.header_args(), prefix), encoding="utf-8")
    wanted = {*MODEL_RUNTIME, family_runtime(model.family), family_twins(model.family)}  # never the device app's
    for source in runtime_files(model.family):
        if source.name in wanted:
            shutil.copyfile(source, src / source.name)
    for extra in LIBRARY_EXTRAS:
        shutil.copyfile(resource_dir("templates") / "arduino" / extra, src / extra)
    (example / f"{name}.ino").write_text(_template("example.ino.j2").render(**context), encoding="utf-8")


def write_zip(library: Path, zip_path: Path) -> None:
    """The library folder at the zip's root (what Add .ZIP Library expects), entries sorted, fixed times."""
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in [library, *sorted(library.rglob("*"))]:
            rel = path.relative_to(library.parent).as_posix()
            if path.is_dir():
                info = zipfile.ZipInfo(rel + "/", date_time=_ZIP_TIME)
                info.external_attr = (0o40755 << 16) | 0x10
                archive.writestr(info, b"")
            else:
                info = zipfile.ZipInfo(rel, date_time=_ZIP_TIME)
                info.external_attr = 0o100644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())


def _check_export_dir(out: Path) -> None:
    """An existing non-empty --out is replaced only if it is an earlier export (never a model directory)."""
    from tinyproto.core.safe_io import read_json

    if not out.is_dir() or not any(out.iterdir()):
        return
    record = out / EXPORT_RECORD
    try:
        ours = record.is_file() and not record.is_symlink() and read_json(record, "").get("format") == EXPORT_FORMAT
    except TinyprotoError:
        ours = False
    if not ours:
        what = "a model directory" if (out / "model.json").exists() else "not an earlier `tinyproto export`"
        raise TinyprotoError(f"--out {out} is not empty and is {what}; choose another --out, nothing was changed")


def export_arduino(model_path: Path, out: Path | None = None, name: str | None = None,
                   prefix: str | None = None) -> ArduinoExport:
    """The library of the model in `model_path`; `prefix` renames its C symbols (default: compile's prefix)."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.core.safe_io import write_json
    from tinyproto.core.outdir import atomic_directory, check_output_dir, tidy
    from tinyproto.device.project import render_arduino_platformio_ini

    model_dir = load_model_dir(model_path)
    tidy(model_dir.path)  # what a killed run left there (core/outdir.py, "leftovers")
    model = families.load_int_model(model_dir)  # a damaged or edited model.json is refused here
    if name is None:
        name = library_name(model_dir.header_args()[0])
        if name == "Tinyproto":  # (checked before check_name, which would blame a --name nobody gave)
            raise TinyprotoError("the data set's name gives no library name; give one with --name")
    name = check_name(name)
    if prefix is not None:
        check_prefix(prefix)
    if out is None:
        out = model_dir.path.parent / f"{model_dir.path.resolve().name}-arduino"
    source, target = model_dir.path.resolve(), resolved(out, "--out", "give a directory beside the model")
    if target == source or source in target.parents or target in source.parents:
        raise TinyprotoError(f"--out {out} is the model directory, inside it or around it; choose a directory "
                             "beside it, nothing was changed")
    out = check_output_dir(out)
    _check_export_dir(out)
    board = load_board(model_dir.board)  # the board the model was compiled for
    with atomic_directory(out, "export") as scratch:
        write_library(model_dir, model, name, scratch / name, board, prefix)
        write_zip(scratch / name, scratch / f"{name}.zip")
        (scratch / "platformio.ini").write_text(render_arduino_platformio_ini(board, name), encoding="utf-8")
        write_json(scratch / EXPORT_RECORD, {"format": EXPORT_FORMAT, "tinyproto_version": __version__,
                                             "name": name, "model_hash": model_dir.meta["model_hash"],
                                             "prefix": prefix or model_dir.prefix,
                                             # relative, so the export and its model move together
                                             "model_dir": os.path.relpath(source, out.resolve())})
    _own_the_build_dir(out)
    return ArduinoExport(out, out / name, out / f"{name}.zip", name)


def _own_the_build_dir(out: Path) -> None:
    """`pio run` in the export (as its platformio.ini and the tutorial say) writes .pio/, the build of tinyproto's
    own project: recorded as the export's, so exporting again after building the example replaces it rather than
    refusing. Anything else the user adds to the directory still stops the replacement."""
    from tinyproto.core.manifest import record_outputs

    record_outputs(out, ".pio")


SKETCH_NAME = "Models"  # the example sketch of an export of several models: OUT/Models/Models.ino


@dataclass(frozen=True)
class SketchExport:
    out_dir: Path
    libraries: tuple[ArduinoExport, ...]
    sketch: Path  # the example sketch that uses every model


def export_arduino_models(model_paths: list[Path], out: Path | None = None) -> SketchExport:
    """Several models for one sketch: each model's library (under its own name and C prefix, as compiled) beside
    the others, their zips, an example sketch OUT/Models/Models.ino that runs any of them by its prefix, and a
    platformio.ini that builds it with every library. Two models with the same prefix or library name are refused
    (compile one again with --prefix, which also names its library)."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.core.safe_io import write_json
    from tinyproto.core.outdir import atomic_directory, check_output_dir, tidy
    from tinyproto.device.project import render_arduino_platformio_ini

    if len(model_paths) < 2:
        raise TinyprotoError("an export of several models needs two model directories or more")
    seen: dict[Path, Path] = {}
    for path in model_paths:  # the same directory twice was refused as "A and A have the C prefix 'iris'"
        real = Path(os.path.realpath(path))
        if real in seen:
            twice = f"{path} is given twice" if str(seen[real]) == str(path) else \
                f"{seen[real]} and {path} are the same directory"
            raise TinyprotoError(f"{twice}; give each model directory once, nothing was changed")
        seen[real] = Path(path)
    loaded = []
    for path in model_paths:
        model_dir = load_model_dir(path)
        tidy(model_dir.path)
        loaded.append((model_dir, families.load_int_model(model_dir)))
    names, prefixes, boards = {}, {}, {}
    for model_dir, _ in loaded:
        prefix = model_dir.prefix
        name = check_name(library_name(prefix))
        for taken, what in ((prefixes, f"the C prefix {prefix!r}"), (names, f"the library name {name}")):
            key = prefix if taken is prefixes else name.lower()
            if key in taken:
                raise TinyprotoError(f"{taken[key]} and {model_dir.path} have {what}; compile one of them again "
                                     "with --prefix NAME, nothing was changed")
            taken[key] = model_dir.path
        boards.setdefault(model_dir.board, model_dir.path)
    if len(boards) > 1:
        raise TinyprotoError(f"the models were compiled for different boards ({', '.join(sorted(boards))}); one "
                             "sketch runs on one board, nothing was changed")
    if out is None:
        out = loaded[0][0].path.parent / "models-arduino"
    target = resolved(out, "--out", "give a directory beside the models")
    for model_dir, _ in loaded:
        source = model_dir.path.resolve()
        if target == source or source in target.parents or target in source.parents:
            raise TinyprotoError(f"--out {out} is a model directory, inside one or around one; choose a directory "
                                 "beside them, nothing was changed")
    out = check_output_dir(out)
    _check_export_dir(out)
    board = load_board(next(iter(boards)))
    with atomic_directory(out, "export") as scratch:
        libraries, records, sketch_models = [], [], []
        for model_dir, model in loaded:
            name = library_name(model_dir.prefix)
            write_library(model_dir, model, name, scratch / name, board)
            write_zip(scratch / name, scratch / f"{name}.zip")
            libraries.append(ArduinoExport(out, out / name, out / f"{name}.zip", name))
            context = _context(model_dir, model, name, board, model_dir.prefix)
            sketch_models.append({key: context[key] for key in ("name", "prefix", "prefix_upper", "n_features",
                                                                "n_classes", "family_title", "dataset_comment")})
            records.append({"name": name, "model_hash": model_dir.meta["model_hash"], "prefix": model_dir.prefix,
                            "model_dir": os.path.relpath(model_dir.path.resolve(), out.resolve())})
        (scratch / SKETCH_NAME).mkdir()
        (scratch / SKETCH_NAME / f"{SKETCH_NAME}.ino").write_text(_template("models.ino.j2").render(
            sketch=SKETCH_NAME, version=__version__, models=sketch_models,
            max_features=max(m["n_features"] for m in sketch_models),
            max_classes=max(m["n_classes"] for m in sketch_models),
            name_buffer=max(len(m["prefix"]) for m in sketch_models) + 2), encoding="utf-8")
        (scratch / "platformio.ini").write_text(
            render_arduino_platformio_ini(board, [lib.name for lib in libraries], SKETCH_NAME), encoding="utf-8")
        write_json(scratch / EXPORT_RECORD, {"format": EXPORT_FORMAT, "tinyproto_version": __version__,
                                             "sketch": SKETCH_NAME, "models": records})
    _own_the_build_dir(out)
    return SketchExport(out, tuple(libraries), out / SKETCH_NAME / f"{SKETCH_NAME}.ino")


# ------------------------------------------------------------------------------------------------ command


