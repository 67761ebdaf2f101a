"""A GGUF model.path is converted once into a safetensors HF folder in model.dtype; a file that is not GGUF is
refused naming the cause. The GGUF is a tiny llama written by the `gguf` package's own writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.weights.model_source import ModelError, check_model, import_gguf
from tests.support.tiny_gguf import write_tiny_gguf
from tests.support.tiny_model import make_tiny_model


def test_gguf_converted_once_in_the_configured_dtype(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = make_tiny_model(tmp_path / "src")
    gguf = write_tiny_gguf(source, tmp_path / "tiny.gguf")
    out = import_gguf(gguf, tmp_path / "model", "float32")
    check_model(out)                                     # an HF folder now
    model = AutoModelForCausalLM.from_pretrained(str(out))
    reference = AutoModelForCausalLM.from_pretrained(str(source))
    ids = torch.tensor([[1, 5, 6, 14, 7, 15]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=1e-5, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.convert_ids_to_tokens([5, 6]) == ["1", "2"]
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(gguf, tmp_path / "model", "float32") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime          # converted once, then reused
    half = AutoModelForCausalLM.from_pretrained(str(import_gguf(gguf, tmp_path / "model", "bfloat16")))
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}        # another dtype: converted again


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "weights.gguf"
    fake.write_bytes(b"\x89PNG not a model")
    with pytest.raises(ModelError, match=r"weights.gguf is not a model: not a GGUF file \(it starts with b'\\x89PNG'"):
        import_gguf(fake, tmp_path / "out", "float32")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ModelError, match="GGUF file does not exist"):
        check_model(tmp_path / "missing.gguf")
