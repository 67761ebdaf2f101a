"""`rlfleet check --explain FIELD`: a config field's dotted name, type, default and description, read from the
pydantic models (the one place a field is documented); an unknown name gets a "did you mean" from the known ones."""

from __future__ import annotations

import difflib
import inspect

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rlfleet.config.conventions import convention_values
from rlfleet.config.field_docs import bounds_text, default_json, section_model, type_name
from rlfleet.config.loading import ConfigError
from rlfleet.config.root import MOVED_FIELDS, Config


def config_fields(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, FieldInfo]:
    """Every field under `model` by dotted name (sections and the fields inside them), in declaration order."""
    found: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        found[path] = field
        sub = section_model(field.annotation)
        if sub is not None:
            found.update(config_fields(sub, f"{path}."))
    return found


def _unknown(name: str, fields: dict[str, FieldInfo]) -> ConfigError:
    if name in MOVED_FIELDS:
        return ConfigError(f"config field '{name}' moved to '{MOVED_FIELDS[name]}'")
    close = difflib.get_close_matches(name, list(fields), n=3, cutoff=0.6)
    if not close:       # a wrong last part: offer the fields of the section it names, else the sections
        parent = name.rpartition(".")[0]
        close = [p for p in fields if p.rpartition(".")[0] == (parent if parent in fields else "")][:8]
    return ConfigError(f"unknown config field '{name}'; did you mean {', '.join(close)}?")


def explain(name: str) -> str:
    """The description of config field `name` (e.g. "trainer.tis.level") as lines of text; ConfigError when no
    field has that name."""
    fields = config_fields()
    field = fields.get(name)
    if field is None:
        raise _unknown(name, fields)
    lines = [name, f"  type: {type_name(field.annotation)}{bounds_text(field)}"]
    default = default_json(field)
    lines.append("  default: " + ("required" if field.is_required() else
                                  "(the section's own defaults)" if default is None else default))
    by_convention = convention_values(name)
    if by_convention:      # a convention knob: what each trainer.convention sets it to (a config's own value wins)
        lines.append("  trainer.convention: " + ", ".join(f"{k} {v}" for k, v in by_convention.items()))
    sub = section_model(field.annotation)
    description = field.description or ""
    doc = inspect.cleandoc(sub.__doc__) if sub is not None and sub.__doc__ else ""
    if doc and not doc.startswith(description.rstrip(".")):
        description = f"{description} {doc}".strip()
    elif doc:
        description = doc
    if description:
        lines.append("  " + " ".join(description.split()))
    if sub is not None:
        lines.append(f"  fields: {', '.join(sub.model_fields)}")
    return "\n".join(lines)
