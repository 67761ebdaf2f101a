"""Every config field is documented in the model, and the config reference (docs/) and the Helm values schema
generated from the models are fresh: scripts/gen_config_docs.py --check fails when either drifts."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

from rlfleet.config import Config

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields(model: type[BaseModel], path: str = "") -> list[tuple[str, str | None, type[BaseModel] | None]]:
    out = []
    for name, field in model.model_fields.items():
        sub = next((t for t in (field.annotation, *getattr(field.annotation, "__args__", ()))
                    if isinstance(t, type) and issubclass(t, BaseModel)), None)
        out.append((f"{path}{name}", field.description, sub))
        if sub is not None:
            out += _fields(sub, f"{path}{name}.")
    return out


def test_every_field_has_a_description() -> None:
    missing = [path for path, description, _ in _fields(Config) if not description]
    assert not missing, f"give these fields Field(..., description=...): {missing}"


def test_generated_files_are_fresh(gen: ModuleType) -> None:
    assert gen.stale(ROOT) == [], "run python scripts/gen_config_docs.py"


def test_drift_is_detected(gen: ModuleType, tmp_path: Path) -> None:
    for rel in (gen.DOCS, gen.SCHEMA):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert gen.stale(tmp_path) == []
    docs = tmp_path / gen.DOCS
    docs.write_text(docs.read_text().replace("Most tokens generated per response.", "Tokens."))
    schema = tmp_path / gen.SCHEMA
    schema.write_text(schema.read_text().replace('"over_sample"', '"oversample"'))
    assert gen.stale(tmp_path) == [str(gen.DOCS), str(gen.SCHEMA)]


def _documented(text: str) -> dict[str, set[str]]:
    """heading (a dotted section path, or "Sections") -> the names in the first column of its table."""
    out: dict[str, set[str]] = {}
    heading = ""
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("# ").strip("`")
            out[heading] = set()
        elif line.startswith("| `") or line.startswith("| [`"):
            out[heading].add(line.split("`")[1])
    return out


def test_reference_documents_every_section_and_field(gen: ModuleType) -> None:
    documented = _documented((ROOT / gen.DOCS).read_text())
    assert documented["Sections"] == set(Config.model_fields)
    seen: set[type[BaseModel]] = set()
    for path, _, sub in _fields(Config):
        if sub is not None and sub not in seen:       # a model met again (eval.data) is documented once
            seen.add(sub)
            assert documented.get(path) == set(sub.model_fields), path


def test_schema_types_each_chart_section_like_the_model(gen: ModuleType) -> None:
    schema = gen.run_config_schema()
    trainer = schema["trainer"]
    assert trainer["additionalProperties"] is False
    assert set(trainer["properties"]) == set(Config.model_fields["trainer"].annotation.model_fields)  # type: ignore
    assert trainer["properties"]["dapo"]["properties"]["clip_high"]["description"]
    assert schema["buffer"]["properties"]["capacity"]["minimum"] == 1
