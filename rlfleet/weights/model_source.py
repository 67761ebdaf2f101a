"""What `model.path` may name: a Hugging Face causal-LM folder, or a GGUF file that is converted once into
RUN_DIR/model (safetensors in model.dtype, with its tokenizer and chat template) before the services start.

GGUF in transformers loads through `from_pretrained(dir, gguf_file=...)` (needs `gguf` and `accelerate`) and leaves a
`quantization_config` that save_pretrained refuses; the conversion drops it, rebuilds the model from its config and
loads the dequantized state dict into it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

GGUF_MAGIC = b"GGUF"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


class ModelError(ValueError):
    """model.path names nothing a run can load; the message says what it is instead."""


def is_gguf_path(path: Path) -> bool:
    return path.suffix == ".gguf" or path.is_file()


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise ModelError(f"model.path {path}: GGUF file does not exist")
    with path.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ModelError(f"model.path {path} is not a model: not a GGUF file (it starts with {head!r}, not b'GGUF') "
                         "and not a Hugging Face folder")


def check_model_folder(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"model.path {path} does not exist (give a Hugging Face model folder or a .gguf file)")
    if not (path / "config.json").is_file():
        raise ModelError(f"model.path {path} is not a Hugging Face model folder (no config.json)")
    if not any(p.suffix in WEIGHT_SUFFIXES for p in path.iterdir()):
        raise ModelError(f"model.path {path} holds no weights (*.safetensors)")


def check_model(path: Path) -> None:
    """Raise ModelError unless path is a loadable HF folder or a GGUF file."""
    if path.is_dir():
        check_model_folder(path)
    elif is_gguf_path(path):
        check_gguf(path)
    else:
        check_model_folder(path)


def converted_folder(run_dir: Path) -> Path:
    return run_dir / "model"


def _gguf_stamp(gguf: Path, dtype: str) -> dict[str, object]:
    return {"source": str(gguf.resolve()), "bytes": gguf.stat().st_size, "dtype": dtype}


GGUF_MARKER = "rlfleet_gguf_source.json"


def gguf_converted(gguf: Path, out: Path, dtype: str) -> bool:
    """`out` already holds the conversion of this file at this dtype (import_gguf would do nothing)."""
    marker = out / GGUF_MARKER
    try:
        return (marker.is_file() and json.loads(marker.read_text()) == _gguf_stamp(gguf, dtype)
                and (out / "config.json").is_file())
    except (OSError, ValueError):
        return False


def import_gguf(gguf: Path, out: Path, dtype: str) -> Path:
    """Convert `gguf` into the HF folder `out` (once: a folder made from the same file and dtype is reused). The
    conversion prints its progress (stage, elapsed time) on stderr."""
    check_gguf(gguf)
    if gguf_converted(gguf, out, dtype):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlfleet.runtime.progress import PhaseProgress

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    progress = PhaseProgress(f"converting GGUF {gguf.name} to {out} ({dtype}; once)", 3, "stages", every=10.0,
                             detail="reading and dequantizing the GGUF")
    try:
        with progress.ticking():
            loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch_dtype)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # noqa: BLE001 - transformers' GGUF errors vary: report them as one
        raise ModelError(f"model.path {gguf}: GGUF file could not be loaded ({type(exc).__name__}: {exc})") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config                 # dequantized on load: what is saved is plain weights
    with progress.ticking():
        progress.update(1, "rebuilding the model as plain weights")
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        model.load_state_dict(loaded.state_dict())
        progress.update(2, "saving safetensors")
        tmp = out.with_name(f".tmp-{out.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
    (tmp / GGUF_MARKER).write_text(json.dumps(_gguf_stamp(gguf, dtype)))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    progress.detail = ""
    progress.finish(3)
    return out
