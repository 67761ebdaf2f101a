"""How a config field is described to a reader: its type, bounds and default as text, read from the pydantic models.

Shared by the generated reference (scripts/gen_config_docs.py writes docs/config-reference.md) and
`rlfleet check --explain FIELD` (rlfleet/config/explain.py), so both say the same about every field.
"""

from __future__ import annotations

import json
import types
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

_BOUNDS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"), (annotated_types.Le, "le", "<="),
           (annotated_types.Lt, "lt", "<"))


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (`X`, `X | None` or a list of X), else None."""
    candidates = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType, list) else (annotation,)
    for tp in candidates:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
    return None


def type_name(tp: Any) -> str:
    """A field's type as the reference writes it: `int`, `"token" | "sequence"`, `list[str]`, `section`."""
    origin = get_origin(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(tp))
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(tp))}]"
    return str(tp.__name__)


def bounds_text(field: FieldInfo) -> str:
    """The field's numeric bounds, e.g. " (>= 1)", or ""."""
    parts = [f"{sign} {getattr(m, attr)}" for m in field.metadata for kind, attr, sign in _BOUNDS
             if isinstance(m, kind)]
    return f" ({', '.join(parts)})" if parts else ""


def default_json(field: FieldInfo) -> str | None:
    """The field's default as JSON; None for a required field or a section (its fields have the defaults)."""
    if field.is_required() or isinstance(field.default, BaseModel):
        return None
    return json.dumps(to_jsonable_python(field.default))
