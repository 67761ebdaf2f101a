"""A GGUF model.path is converted once, with its progress on the console; a later run of the same file says nothing
about converting (the folder is current)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.weights.model_source import gguf_converted, import_gguf
from tests.support.tiny_gguf import write_tiny_gguf
from tests.support.tiny_model import make_tiny_model


def test_conversion_progress_only_when_converting(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    gguf = write_tiny_gguf(make_tiny_model(tmp_path / "tiny"), tmp_path / "tiny.gguf")
    out = tmp_path / "run" / "model"
    assert not gguf_converted(gguf, out, "float32")
    import_gguf(gguf, out, "float32")
    first = capfd.readouterr().err
    lines = [ln for ln in first.splitlines() if ln.startswith("converting GGUF tiny.gguf")]
    assert lines[0].endswith("0/3 stages (0%), 0.0 stages/s, ETA ?; reading and dequantizing the GGUF")
    assert " 3/3 stages in " in lines[-1]
    assert gguf_converted(gguf, out, "float32")
    import_gguf(gguf, out, "float32")
    assert "converting GGUF" not in capfd.readouterr().err
    assert not gguf_converted(gguf, out, "bfloat16")          # another dtype is another conversion
