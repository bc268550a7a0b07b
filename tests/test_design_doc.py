"""docs/design.md stays true: its checkable claims are compared with the code. The module list equals the modules
on disk, the layer diagram equals tests/test_layers.py's ranks, the family table equals the registry's declared
facts, and the firmware files it names are the files of firmware/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import LAYER_RANK as RANK
from helpers import variants

from tinyproto import families
from tinyproto.core.resources import resource_dir

ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "docs" / "design.md").read_text()
PACKAGE = ROOT / "tinyproto"


def section(title: str) -> str:
    """The text of the `## title` section (up to the next `## `)."""
    start = DESIGN.index(f"\n## {title}")
    end = DESIGN.find("\n## ", start + 1)
    return DESIGN[start: end if end >= 0 else len(DESIGN)]


def test_the_module_list_is_every_module_on_disk():
    listed = re.findall(r"^- `([\w/]+\.py)`: \S", section("Modules"), re.M)
    on_disk = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))
    assert len(listed) == len(set(listed)), "a module is listed twice"
    missing, stale = sorted(set(on_disk) - set(listed)), sorted(set(listed) - set(on_disk))
    assert not missing and not stale, f"docs/design.md, ## Modules: add {missing}, remove {stale}"


def test_the_layer_diagram_is_the_layers_test():
    diagram = section("The layers").split("```")[1]
    layers = re.findall(r"(\w+)/\s", diagram)
    assert layers == ["cli", "pipeline", "federated", "families", "device", "core"]
    assert [RANK[name] for name in layers] == sorted((RANK[name] for name in layers), reverse=True)
    assert set(layers) == set(RANK)


def family_table() -> dict[str, list[str]]:
    rows = re.findall(r"^\| (\w+) \| (.+?) \|$", section("The family interface"), re.M)
    return {name: [cell.strip() for cell in rest.split("|")] for name, rest in rows if name != "family"}


def test_the_family_table_is_the_registry(compiled):
    table = family_table()
    assert list(table) == list(families.names())
    reentrant: dict[str, set[bool]] = {}
    family_ids = {}
    for model in variants(compiled):
        reentrant.setdefault(model.family, set()).add(families.family_of(model).static_state(model).reentrant)
        family_ids[model.family] = model.family_id
    yes_no = {True: "yes", False: "no"}
    for name, (title, family_id, runtime, wins, learns, streams, keeps_static) in table.items():
        fam = families.family(name)
        assert title == fam.title and int(family_id) == family_ids[name], name
        assert runtime == f"`tp_{name}.c`" and (resource_dir("firmware") / runtime.strip("`")).is_file(), name
        assert wins == fam.score.wins and learns == yes_no[fam.learnable] and streams == yes_no[fam.streamable], name
        seen = reentrant[name]
        if seen == {True}:
            assert keeps_static == "no", name
        elif seen == {False}:
            assert keeps_static == "yes", name
        else:  # it depends on the model: the doc must say on what, not yes or no
            assert keeps_static not in ("yes", "no"), name


def test_the_firmware_files_named_are_the_firmware_directory():
    text = section("The C runtime (`firmware/`)")
    named = set(re.findall(r"`((?:tp_\w+|tinyproto)\.[ch])`", text))
    for pattern in re.findall(r"`(tp_<family>\w*\.[ch])`", text):  # a file per family, named by its pattern
        named |= {pattern.replace("<family>", name) for name in families.names()}
    on_disk = {p.name for p in resource_dir("firmware").iterdir() if p.suffix in (".c", ".h")}
    assert named == on_disk, f"docs/design.md, ## The C runtime: add {sorted(on_disk - named)}, " \
                             f"remove {sorted(named - on_disk)}"


@pytest.mark.parametrize("claim", ["no Python module\noutside `families/` holds a family's name",
                                   "`tests/test_family_names.py`"])
def test_the_name_rule_points_at_its_test(claim):
    assert " ".join(claim.lower().split()) in " ".join(section("The family interface").lower().split())
