"""Config errors name the field and the file; overrides apply; the example config is valid."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlfleet.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "addition" / "config.yaml"


def test_example_config_loads() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.rollout.group_size == 8 and cfg.buffer.max_staleness == 1    # the file's, not the default (0)
    assert cfg.model_path == Path("runs/addition/warm_start")


def test_misspelt_field_names_field_and_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("max_staleness:", "max_stalenes:"))
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    msg = str(info.value)
    assert str(bad) in msg and "buffer.max_stalenes" in msg and "unknown field" in msg
    assert "did you mean max_staleness?" in msg


def test_unknown_field_with_no_close_name_lists_its_sections_fields(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("  bucket_mb: 4", "  zzz: 4"))
    msg = str(pytest.raises(ConfigError, load_config, bad).value)
    assert "weight_sync.zzz: unknown field (this section's fields: " in msg and "bucket_mb" in msg


def test_wrong_type_and_range(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    text = re.sub(r"(?m)^  lr: .*$", "  lr: -1", EXAMPLE.read_text()).replace("group_size: 8", "group_size: many")
    bad.write_text(text)
    msg = str(pytest.raises(ConfigError, load_config, bad).value)
    assert "rollout.group_size" in msg and "trainer.lr" in msg


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_overrides() -> None:
    cfg = load_config(EXAMPLE, {"trainer.steps": 3, "buffer.max_staleness": 2})
    assert cfg.trainer.steps == 3 and cfg.buffer.max_staleness == 2
    with pytest.raises(ConfigError, match="trainer.stepz"):
        load_config(EXAMPLE, {"trainer.stepz": 3})


def test_grpo_needs_groups() -> None:
    with pytest.raises(ConfigError, match="group_size must be >= 2"):
        load_config(EXAMPLE, {"rollout.group_size": 1})


def test_buffer_over_sample() -> None:
    from rlfleet.services.buffer.gate import Gate
    from rlfleet.services.buffer.settings import BufferSettings

    assert load_config(EXAMPLE).buffer.over_sample == 1.0
    cfg = load_config(EXAMPLE, {"buffer.over_sample": 1.5, "trainer.groups_per_step": 3})
    settings = BufferSettings.from_config(cfg)
    assert settings.over_sample == 1.5
    assert Gate.of(settings.groups_per_step, settings.over_sample, 1, 0).per_step == 5      # ceil(1.5 * 3)
    for bad in (0.5, "lots"):
        with pytest.raises(ConfigError, match="buffer.over_sample"):
            load_config(EXAMPLE, {"buffer.over_sample": bad})


@pytest.mark.parametrize(("old", "new", "value"), [("trainer.dapo_clip_high", "trainer.dapo.clip_high", 0.3),
                                                  ("trainer.gspo_clip", "trainer.gspo.clip", [1e-3, 2e-3]),
                                                  ("trainer.drgrpo_max_tokens", "trainer.drgrpo.max_tokens", 5)])
def test_moved_per_algorithm_field_names_its_new_place(old: str, new: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{old}: moved: write {new}"):
        load_config(EXAMPLE, {old: value})
    cfg = load_config(EXAMPLE, {new: value})
    section, name = new.split(".")[1:]
    got = getattr(getattr(cfg.trainer, section), name)
    assert got == (tuple(value) if isinstance(value, list) else value)


@pytest.mark.parametrize("example", sorted(p.parent.name for p in (ROOT / "examples").glob("*/config.yaml")))
def test_every_example_config_loads(example: str) -> None:
    load_config(ROOT / "examples" / example / "config.yaml")
