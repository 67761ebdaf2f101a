"""The OpenAI endpoint's keys: rollout.openai.api_key_file may list several (one per tenant), each request is matched
to the one it carries, and a key's owner id (what a session records) is not the key and does not depend on the
order of the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfleet.config import Config, ConfigError, parse_config
from rlfleet.services.rollout.openai_api.credentials import api_keys
from rlfleet.services.rollout.openai_api.keys import ApiKeys, owner_id


def _cfg(tmp_path: Path, key_file: Path) -> Config:
    return parse_config({
        "run": {"dir": str(tmp_path / "run")}, "model": {"path": str(tmp_path / "model")},
        "rollout": {"data_source": "x:y", "reward_fn": "x:y", "group_size": 2,
                    "openai": {"enabled": True, "api_key_file": str(key_file)}},
        "security": {"mode": "mtls"},
    })


def _secret(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def test_a_key_file_lists_one_key_a_line_first_for_the_run(tmp_path: Path) -> None:
    path = _secret(tmp_path / "keys", "tenant-a\n\n  tenant-b  \ntenant-a\n")
    assert api_keys(_cfg(tmp_path, path), None) == ("tenant-a", "tenant-b")
    empty = _secret(tmp_path / "empty", "\n \n")
    with pytest.raises(ConfigError, match="is empty"):
        api_keys(_cfg(tmp_path, empty), None)


def test_each_request_is_matched_to_the_key_it_carries() -> None:
    keys = ApiKeys(["tenant-a", "tenant-b"])
    a, b = keys.owner("Bearer tenant-a"), keys.owner("Bearer tenant-b")
    assert a == owner_id("tenant-a") and b == owner_id("tenant-b") and a != b
    assert "tenant-a" not in str(a)
    assert keys.owner("Bearer tenant-c") is None and keys.owner("tenant-a") is None and keys.owner("") is None
    assert not keys.allows("Bearer nope") and keys.allows("Bearer tenant-b")
    assert ApiKeys(["tenant-b", "tenant-a"]).owner("Bearer tenant-a") == a        # the file's order does not matter
    assert not ApiKeys(None).required and ApiKeys(None).allows("") and ApiKeys(None).owner("Bearer x") is None
    with pytest.raises(ValueError):
        ApiKeys([" spaced"])
