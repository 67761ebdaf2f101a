"""Reading a run config: YAML to the typed model, `--set` overrides, errors that name the field and the file, and
writing the resolved config into the run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlfleet.config.root import MOVED_FIELDS, Config


class ConfigError(ValueError):
    """The config file is missing, unreadable, or has a wrong field."""


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] != "extra_forbidden":
            msg = err["msg"]
        elif loc in MOVED_FIELDS:
            msg = f"moved: write {MOVED_FIELDS[loc]}"
        else:
            msg = "unknown field (check the spelling)"
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
