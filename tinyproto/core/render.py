"""Render a quantized model to C: the generated header plus copies of the runtime it needs.

Python decides every value; the Jinja2 templates only lay the pre-formatted values out.
Layer: core.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import jinja2
import numpy as np

from tinyproto.core.version import __version__
from tinyproto.core.carray import CArray
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.resources import resource_dir

RUNTIME_ABI = 1  # must equal TP_RUNTIME_ABI in firmware/tinyproto.h
VALUES_PER_ROW = 16
# The model's runtime, what a sketch needs too: the common header with the reference primitives, their AVR twins,
# the input stage; each family adds family_runtime(). Every project also gets the serial transport (lib/tinyproto/),
# and the device application (src/): its main file becomes src/main.c, its other parts (transport, measurement,
# learning, their shared header) keep their names.
MODEL_RUNTIME = ("tinyproto.h", "tp_avr.h", "tp_input.c", "tp_judge.c", "tp_judge_avr.h")
COMMON_RUNTIME = (*MODEL_RUNTIME, "tp_serial.h", "tp_serial.c")
DEVICE_APP = "tp_main.c"
DEVICE_APP_PARTS = ("tp_app.h", "tp_transport.c", "tp_measure.c", "tp_learn.c")
SIZES_HEADER = "tinyproto_sizes.h"

# ---- Model prefixes: several models in one program -------------------------------------------------------------
# The runtime is written with tp_ names (tp_predict, tp_input_quantize, tp_<family>_..., the model arrays tp_<name>).
# The generated header maps every one of a model's external C symbols to the model's own prefix
# (#define tp_predict digits_predict), so the objects of any number of models link into one program; the runtime
# files are copied unchanged. Static functions, static inline primitives and macros keep their tp_ names: they never
# reach the linker.
PREFIX_RE = re.compile(r"^[a-z][a-z0-9_]{0,23}$")
PREFIX_MAX = 24
SHARED_PREFIX = "tp"  # the names every model shares (the Arduino library's tp_parse_float): no model may take it
# A file-scope line that declares or defines an external symbol of the runtime: not static, not a type, a macro or
# an extern (the declaration of someone else's), starting in column 0 (code inside a body is indented).
_EXTERNAL_LINE = re.compile(r"^(?![^\n(\[=;]*\b(?:static|typedef|extern|return)\b)"
                            r"[A-Za-z_][\w \t*]*?\b(tp_\w+)\s*[(\[=;]", re.M)
RANGE_SIGNAL = "tp_range_signal"  # a family runtime's byte that tp_judge checks (core/confidence: the range)
# the clip check's count and the function every family's runtime hands its inputs to (tp_judge.c): they exist only
# in a model with the check, whose header alone declares the function (after its renames, as the API's prototypes)
CLIP_FUNCTION = "tp_judge_inputs"
CLIP_SYMBOLS = ("tp_clip_count", CLIP_FUNCTION)
CLIP_PROTOTYPE = f"void {CLIP_FUNCTION}(const int8_t *x, uint16_t first, uint16_t n);"
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def default_prefix(dataset: str) -> str:
    """The prefix of a model trained on `dataset` when none is given: 'breast_cancer' -> 'breast_cancer',
    'my-data.v2 (final)' -> 'my_data_v2_final', '2020 runs' -> 'data_2020_runs' (a C identifier, lower case)."""
    words = [w for w in re.split(r"[^a-z0-9]+", str(dataset).lower()) if w]
    prefix = "_".join(words) or "model"
    if not prefix[0].isalpha():
        prefix = "data_" + prefix
    prefix = prefix[:PREFIX_MAX].rstrip("_")
    return "model" if prefix == SHARED_PREFIX else prefix


def check_prefix(prefix: str) -> str:
    """A usable model prefix, or one clear error: lower case, a C identifier's characters, at most PREFIX_MAX."""
    if not PREFIX_RE.match(prefix) or "__" in prefix or prefix.endswith("_"):
        raise TinyprotoError(f"--prefix {prefix!r} is not usable: a prefix is a lower-case C identifier of at most "
                             f"{PREFIX_MAX} characters (a letter, then letters, digits or single _), e.g. digits")
    if prefix == SHARED_PREFIX:
        raise TinyprotoError(f"--prefix {prefix!r} is the runtime's own (the names every model shares); choose "
                             "another, e.g. the data set's name")
    return prefix


def _code_of(path: Path) -> str:
    return _COMMENT.sub(" ", path.read_text(encoding="utf-8"))


def external_symbols(model) -> list[str]:
    """Every tp_ name of the model's runtime that reaches the linker: the C API (tinyproto.h), what the runtime's C
    files (model_sources) define outside `static`, and the model's arrays. tests/test_prefixes.py checks this
    list against the symbols the compiled objects really define."""
    firmware = resource_dir("firmware")
    names = {f"tp_{a.name}" for a in model.carrays()}
    for source in ("tinyproto.h", *model_sources(model.family)):
        if (firmware / source).exists():
            names.update(match.group(1) for match in _EXTERNAL_LINE.finditer(_code_of(firmware / source)))
    defines = model.defines()
    if "TP_UNKNOWN_RANGE_LOW" not in defines:  # a family's range signal exists only beside a range check
        names.discard(RANGE_SIGNAL)
    if "TP_UNKNOWN_CLIPS" not in defines:  # the one place that asks whether the model has a clip check
        names.difference_update(CLIP_SYMBOLS)
    return sorted(names)


def model_sources(family: str) -> list[str]:
    """The C files compiled for one model (never the device app's): the shared ones of MODEL_RUNTIME and the
    family's runtime."""
    return [*(name for name in MODEL_RUNTIME if name.endswith(".c")), family_runtime(family)]


def api_prototypes() -> list[str]:
    """The C API's prototypes as tinyproto.h writes them (one line each), re-declared by the generated header after
    its renames: a file that included tinyproto.h first then calls the model's prefixed functions."""
    code = _code_of(resource_dir("firmware") / "tinyproto.h")
    return [" ".join(m.group(0).split()) for m in re.finditer(r"^(?![^\n(]*\b(?:static|typedef|extern)\b)[A-Za-z_]"
                                                             r"[\w \t*]*?\btp_\w+\s*\([^;{]*\)\s*;", code, re.M)]


def model_prototypes(symbols: list[str]) -> list[str]:
    """The prototypes the generated header re-declares after its renames: the C API's, and the clip check's function
    where it is among the model's external symbols (only such a model has it)."""
    return api_prototypes() + ([CLIP_PROTOTYPE] if CLIP_FUNCTION in symbols else [])


def symbol_renames(symbols: list[str], prefix: str) -> list[tuple[str, str]]:
    """(tp_name, prefixed name) for each external symbol of a model (external_symbols): tp_predict ->
    <prefix>_predict."""
    return [(name, f"{prefix}_{name[3:]}") for name in symbols]


def jinja_env() -> jinja2.Environment:
    """The one Jinja2 environment for every template: a missing variable is an error, not an empty string."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resource_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def _c_literal(value: int) -> str:
    return f"({value})" if value < 0 else str(value)


def _rows(array: CArray) -> list[str]:
    values = [str(int(v)) for v in array.values]
    rows = [", ".join(values[i : i + VALUES_PER_ROW]) + "," for i in range(0, len(values), VALUES_PER_ROW)]
    return rows


def model_hash(model) -> int:
    """32-bit identity of the deployed model: its defines and the bytes of every array (no timestamps)."""
    digest = hashlib.sha256()
    for name, value in sorted(model.defines().items()):
        digest.update(f"{name}={value};".encode())
    digest.update(f"family={model.family};features={model.n_features};classes={model.n_classes};".encode())
    for array in model.carrays():
        digest.update(f"{array.name}:{array.ctype}:{array.count}:".encode())
        digest.update(np.ascontiguousarray(array.values).astype(array.values.dtype.newbyteorder("<")).tobytes())
    return int.from_bytes(digest.digest()[:4], "big")


def header_defines(model) -> dict[str, int]:
    """Every #define of the generated header: the common identity first, then the family's constants."""
    family = model.family
    return {
        "TP_N_FEATURES": model.n_features,
        "TP_N_CLASSES": model.n_classes,
        "TP_FAMILY_ID": model.family_id,
        f"TP_FAMILY_{family.upper()}": 1,
        **model.defines(),
    }


def comment_text(text: object) -> str:
    """`text` made safe inside a C block comment: no `*/` to end it, no line break or control character (a data
    set's name comes from a file name or an editable model.json, and must never become code)."""
    return re.sub(r"[\x00-\x1f\x7f]|\*/", "?", str(text))


def render_header(model, dataset: str, seed: int, budget_bytes: int, prefix: str | None = None) -> str:
    """include/tinyproto_model.h: the model's defines and PROGMEM arrays, and its C names under `prefix` (default:
    from the data set's name)."""
    prefix = check_prefix(prefix) if prefix is not None else default_prefix(dataset)
    arrays = model.carrays()
    symbols = external_symbols(model)
    defines = [(name, _c_literal(int(value))) for name, value in header_defines(model).items()]
    defines.append(("TP_MODEL_HASH", f"0x{model_hash(model):08X}UL"))
    return jinja_env().get_template("tinyproto_model.h.j2").render(
        version=__version__,
        family=model.family,
        dataset=comment_text(dataset),
        seed=int(seed),
        model_bytes=sum(a.nbytes for a in arrays),
        budget_bytes=int(budget_bytes),
        abi=RUNTIME_ABI,
        prefix=prefix,
        renames=symbol_renames(symbols, prefix),
        prototypes=model_prototypes(symbols),
        defines=defines,
        arrays=[
            {"name": a.name, "ctype": a.ctype, "count": a.count, "nbytes": a.nbytes, "what": a.what, "rows": _rows(a)}
            for a in arrays
        ],
    )


def render_sizes_header(n_classes: int, rx_ring: int | None = None) -> str:
    """include/tinyproto_sizes.h: every size the host and the device app share (tinyproto/core/wire.py).
    rx_ring: the model's receive ring (compile sizes it to the board's free SRAM; None: wire.RX_RING_BYTES)."""
    from tinyproto.core import wire

    ring = wire.RX_RING_BYTES if rx_ring is None else rx_ring
    return jinja_env().get_template("tinyproto_sizes.h.j2").render(
        n_classes=n_classes, defines=list(wire.sizes_defines(n_classes, ring).items()))


def family_runtime(family: str) -> str:
    """The file name of a family's C runtime in firmware/: the one place the tp_<name>.c convention is written."""
    return f"tp_{family}.c"


def family_twins(family: str) -> str:
    """The file name of the AVR twins of a family's kernels (firmware/tp_<name>_avr.h), which its runtime includes
    when tinyproto.h chooses the AVR kernels."""
    return f"tp_{family}_avr.h"


def runtime_files(family: str) -> list[Path]:
    """The firmware/ sources a project of this family needs (its own files plus the common ones)."""
    firmware = resource_dir("firmware")
    names = [*COMMON_RUNTIME, family_runtime(family), family_twins(family)]
    return [firmware / name for name in names if (firmware / name).exists()]


def write_sources(model, project_dir: Path, dataset: str, seed: int, budget_bytes: int,
                  rx_ring: int | None = None, prefix: str | None = None) -> None:
    """include/tinyproto_model.h + tinyproto_sizes.h, lib/tinyproto/<runtime>, src/main.c + the app's other
    parts under project_dir. rx_ring: the serial receive ring (see render_sizes_header); prefix: the model's C
    names (default: from the data set's name)."""
    (project_dir / "include").mkdir(parents=True, exist_ok=True)
    (project_dir / "include" / "tinyproto_model.h").write_text(
        render_header(model, dataset, seed, budget_bytes, prefix), encoding="utf-8")
    (project_dir / "include" / SIZES_HEADER).write_text(render_sizes_header(model.n_classes, rx_ring), encoding="utf-8")
    lib = project_dir / "lib" / "tinyproto"
    lib.mkdir(parents=True, exist_ok=True)
    for source in runtime_files(model.family):
        shutil.copyfile(source, lib / source.name)
    app = resource_dir("firmware") / DEVICE_APP
    if app.exists():
        (project_dir / "src").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(app, project_dir / "src" / "main.c")
        for part in DEVICE_APP_PARTS:
            shutil.copyfile(resource_dir("firmware") / part, project_dir / "src" / part)
