"""A test needing a tool the CI script installs skips where the tool is missing, and fails under CI=true."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

BODY = """
from tests.support.requires import missing, requires

@requires("no-such-tool is not installed")
def test_marked():
    pass

@requires(None)
def test_present():
    pass

def test_called():
    missing("no-such-binary is not on PATH")
"""


@pytest.mark.parametrize(("ci", "outcomes"), [("", {"passed": 1, "skipped": 2}),
                                              ("true", {"passed": 1, "failed": 1, "errors": 1})])
def test_missing_tool_skips_outside_ci_and_fails_in_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                      ci: str, outcomes: dict[str, int]) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makeconftest("from tests.conftest import pytest_configure, pytest_runtest_setup  # noqa: F401\n")
    pytester.makepyfile(test_tools=BODY)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(**outcomes)
    if ci:
        result.stdout.fnmatch_lines(["*CI=true and a tool the CI script installs is missing: no-such-binary*"])
