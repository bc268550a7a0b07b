"""Nothing outside tinyproto/families/ decides anything by a family's name: no Python code compares, keys or
passes a family name as a literal, no template names a family, and the firmware file of a family is chosen in
one place (core/render.family_runtime). Callers read the family's declared facts instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tinyproto import families
from tinyproto.core.resources import resource_dir

PACKAGE = Path(families.__file__).resolve().parents[1]  # tinyproto/
FAMILIES = PACKAGE / "families"
# federated/ is federated FlyNN (FlyNN-FL): the one layer built on a single family, by design (docs/design.md)
ONE_FAMILY_LAYERS = {"federated"}


def outside_families() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if FAMILIES not in p.parents)


def words() -> set[str]:
    """Every family's name and title, lower-cased (a title's first word too: 'Bloom features' -> 'bloom')."""
    out = set()
    for name in families.names():
        fam = families.family(name)
        out |= {name.lower(), fam.title.lower(), fam.title.split()[0].lower()}
    return out


def name_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals (and f-string parts) that are exactly a family's name or title: what a comparison, a dict
    key, a `family("...")` call or a `in (...)` test would use."""
    known = words()
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip().lower() in known]


def family_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                   else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        found += [(node.lineno, m) for m in modules if re.match(r"tinyproto\.families\.\w+", m)]
    return found


def test_no_python_outside_families_names_a_family():
    problems = []
    for path in outside_families():
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(PACKAGE)
        problems += [f"{rel}:{line}: the literal {value!r}" for line, value in name_literals(tree)]
        if rel.parts[0] not in ONE_FAMILY_LAYERS:
            problems += [f"{rel}:{line}: imports {module}" for line, module in family_imports(tree)]
    assert not problems, "decide by the family's declared facts (tinyproto.families.Family), not its name:\n" + \
        "\n".join(problems)


def test_no_template_names_a_family():
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in sorted(words())) + r")\b", re.IGNORECASE)
    problems = []
    for path in sorted(resource_dir("templates").rglob("*")):
        if path.is_file() and path.suffix in (".j2", ".h", ".c", ".py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    problems.append(f"{path.name}:{number}: {line.strip()}")
    assert not problems, "templates take a family's statements from its facts:\n" + "\n".join(problems)


def test_a_family_runtime_file_is_chosen_in_one_place():
    """firmware/tp_<name>.c is named by core/render.family_runtime only; every other caller asks it."""
    pattern = re.compile(r"""["']tp_\{""")
    users = [p.relative_to(PACKAGE).as_posix() for p in outside_families() if pattern.search(p.read_text())]
    assert users == ["core/render.py"]
    for name in families.names():
        assert (resource_dir("firmware") / f"tp_{name}.c").is_file(), name


def test_the_scan_finds_a_name_comparison():
    """The scan is not blind: each kind of use it must catch is caught."""
    for source in ('if model.family == "flynn": pass', 'x = {"bnc": 1}', 'f = family("Bloom")',
                   'ok = name in ("protonn", "bnc")', "y = f'{x}' + 'ProtoNN'"):
        assert name_literals(ast.parse(source)), source
    assert family_imports(ast.parse("from tinyproto.families.flynn.solver import x"))
    assert not name_literals(ast.parse('"""FlyNN learns on the device."""'))
