"""Reading a run config: YAML to the typed model, `--set` overrides, errors that name the field and the file, and
writing the resolved config into the run folder."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlfleet.config.field_docs import section_model
from rlfleet.config.root import MOVED_FIELDS, Config


class ConfigError(ValueError):
    """The config file is missing, unreadable, or has a wrong field."""


def _did_you_mean(loc: tuple[int | str, ...]) -> str:
    """'; did you mean X?' from the names of the section the unknown field sits in, or the section's field list."""
    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        model = section_model(field.annotation) if field is not None else None
    if model is None:
        return " (check the spelling)"
    names = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=3, cutoff=0.6)
    if close:
        return f"; did you mean {' or '.join(close)}?"
    return f" (this section's fields: {', '.join(names)})"


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] != "extra_forbidden":
            msg = err["msg"]
        elif loc in MOVED_FIELDS:
            msg = f"moved: write {MOVED_FIELDS[loc]}"
        else:
            msg = "unknown field" + _did_you_mean(err["loc"])
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: expected a mapping at the top level")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
    if overrides:
        data = apply_overrides(data or {}, overrides)
    return parse_config(data, str(p))


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys ('trainer.steps': 5) in a nested mapping, returning a new mapping."""
    out = yaml.safe_load(yaml.safe_dump(data))
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def dump_config(cfg: Config, path: Path) -> None:
    from rlfleet.run_dir.atomic import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
