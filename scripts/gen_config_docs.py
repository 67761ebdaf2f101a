"""Regenerate docs/config-reference.md and the run-config part of deploy/helm/rlfleet/values.schema.json from the
field descriptions in rlfleet/config/ (the one place a config field is documented).

Usage: python scripts/gen_config_docs.py [--check]   (--check: exit 1 when either committed file is stale)
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:          # run as a script: document this checkout's models, not an installed copy's
    sys.path.insert(0, str(ROOT))

from rlfleet.config import MOVED_FIELDS, Config  # noqa: E402
from rlfleet.config.field_docs import bounds_text, default_json, section_model, type_name  # noqa: E402

DOCS = Path("docs") / "config-reference.md"
SCHEMA = Path("deploy") / "helm" / "rlfleet" / "values.schema.json"
# runConfig sections the chart passes through as written; the chart's own rules for the others stay hand-written
# in the schema (security: the chart runs token or none, and fills token_file itself).
CHART_SECTIONS = ("run", "model", "rollout", "buffer", "trainer", "weight_sync", "eval")


# --- docs/config-reference.md ---------------------------------------------------------------------------------------

def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = default_json(field)
    return "" if value is None else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _anchor(path: str) -> str:
    return path.replace(".", "").lower()          # GitHub's anchor of a heading `a.b_c`: "ab_c"


def _sections(model: type[BaseModel], path: str, seen: dict[type[BaseModel], str]) -> Iterator[tuple[str, type]]:
    """(dotted path, model) of every section under `model`, depth first; a model met again is documented once."""
    for name, field in model.model_fields.items():
        sub = section_model(field.annotation)
        if sub is not None and sub not in seen:
            seen[sub] = f"{path}{name}"
            yield f"{path}{name}", sub
            yield from _sections(sub, f"{path}{name}.", seen)


def _section_doc(heading: str, model: type[BaseModel], seen: dict[type[BaseModel], str]) -> list[str]:
    lines = [heading, ""]
    if model.__doc__:
        lines += [" ".join(inspect.cleandoc(model.__doc__).split()), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        description = field.description or ""
        sub = section_model(field.annotation)
        if sub is not None:
            where = seen[sub]
            description = f"{description} Fields: [`{where}`](#{_anchor(where)})."
        kind = type_name(field.annotation) + bounds_text(field)
        lines.append(f"| `{name}` | {_cell(f'`{kind}`')} | {_cell(_default(field))} | {_cell(description)} |")
    return lines + [""]


def render_docs() -> str:
    seen: dict[type[BaseModel], str] = {}
    sections = list(_sections(Config, "", seen))
    lines = [
        "# Config reference",
        "",
        "<!-- Generated from the field descriptions in rlfleet/config/ by `python scripts/gen_config_docs.py`;",
        "     do not edit (tests/unit/config/test_config_docs.py fails when this file drifts from the models). -->",
        "",
        "A run is one YAML file with one section per service; every section but `model` and `rollout` may be left",
        "out. An unknown or misspelt field is refused, naming the field and the file, and so is a field that moved",
        "(the error names its new place). `rlfleet check CONFIG` validates a config and every plugin it names without",
        "starting anything; `rlfleet run` runs the same checks first. `rlfleet check --explain trainer.tis.level`",
        "prints one field's type, default and description. Example:",
        "[examples/addition/config.yaml](../examples/addition/config.yaml). In the Helm chart the `runConfig` values",
        "hold these sections (deploy/helm/rlfleet/values.schema.json is generated from the same models); what the",
        "chart sets itself is in [docs/cluster.md](cluster.md).",
        "",
    ]
    lines += ["## Sections", "", "| section | description |", "|---|---|"]
    lines += [f"| [`{name}`](#{_anchor(name)}) | {'(required) ' if field.is_required() else ''}"
              f"{_cell(field.description or '')} |" for name, field in Config.model_fields.items()]
    lines.append("")
    for path, model in sections:
        lines += _section_doc(f"{'###' if '.' in path else '##'} `{path}`", model, seen)
    lines += ["## Moved fields", "", "A config that uses an old name is refused with the new one.", "",
              "| old | new |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in MOVED_FIELDS.items()]
    return "\n".join(lines).rstrip("\n") + "\n"


# --- values.schema.json ---------------------------------------------------------------------------------------------

def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """A self-contained draft-07 schema: $refs replaced by their definitions, titles dropped, tuples as `items`."""
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        siblings = {k: v for k, v in node.items() if k not in ("$ref", "default")}   # a section's default: noise
        return _inline({**target, **siblings}, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "properties":
            out[key] = {name: _inline(sub, defs) for name, sub in value.items()}
        elif key in ("default", "enum", "const"):
            out[key] = value
        elif key == "description":
            out[key] = " ".join(value.split())
        elif key == "prefixItems":
            out["items"] = _inline(value, defs)
        else:
            out[key] = _inline(value, defs)
    return out


def run_config_schema() -> dict[str, dict[str, Any]]:
    """The JSON schema of each run-config section the chart passes through."""
    schema = Config.model_json_schema()
    full = _inline({k: v for k, v in schema.items() if k != "$defs"}, schema.get("$defs", {}))
    return {name: full["properties"][name] for name in CHART_SECTIONS}


def render_schema(current: dict[str, Any]) -> str:
    """values.schema.json with its runConfig sections generated, everything else as it is."""
    run_config = current["properties"]["runConfig"]
    generated = run_config_schema()
    props = {name: generated.get(name, sub) for name, sub in run_config["properties"].items()}
    props.update({name: sub for name, sub in generated.items() if name not in props})
    run_config["description"] = ("The run config (rlfleet/config/; these sections are generated by "
                                 "scripts/gen_config_docs.py, reference: docs/config-reference.md).")
    run_config["properties"] = props
    return json.dumps(current, indent=2, ensure_ascii=False) + "\n"


# --- the two files --------------------------------------------------------------------------------------------------

def generated(root: Path) -> dict[Path, str]:
    """Each generated file's path under root and the text it should hold."""
    current = json.loads((root / SCHEMA).read_text())
    return {root / DOCS: render_docs(), root / SCHEMA: render_schema(current)}


def stale(root: Path) -> list[str]:
    return [str(path.relative_to(root)) for path, text in generated(root).items()
            if not path.exists() or path.read_text() != text]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    if not ns.check:
        for path, text in generated(ROOT).items():
            path.write_text(text)
        return 0
    drifted = stale(ROOT)
    if drifted:
        print(f"stale generated config files: {drifted}; run python scripts/gen_config_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
