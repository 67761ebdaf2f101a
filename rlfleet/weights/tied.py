"""Tied weights (e.g. lm_head.weight = model.embed_tokens.weight): one tensor under several state-dict names.

A publish sends each tensor once, under its first name, and lists the other names in the manifest option
`tied` ("alias=source;alias=source"); the replica loads it once (an engine whose model is tied the same way holds
one tensor) and copies it to an alias only where its engine holds the alias as a separate tensor.
"""

from __future__ import annotations

import torch

TIED_OPTION = "tied"


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """alias name -> source name, for every parameter or buffer reachable under more than one name."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        source = first.setdefault(id(tensor), name)
        if source != name:
            aliases[name] = source
    return aliases


def encode_aliases(aliases: dict[str, str]) -> str:
    return ";".join(f"{alias}={source}" for alias, source in aliases.items())


def decode_aliases(option: str) -> dict[str, str]:
    """The manifest's `tied` option -> alias -> source. Raises ValueError naming a malformed entry."""
    out: dict[str, str] = {}
    for entry in filter(None, option.split(";")):
        alias, sep, source = entry.partition("=")
        if not sep or not alias or not source:
            raise ValueError(f"manifest option '{TIED_OPTION}': malformed entry '{entry}' (want alias=source)")
        out[alias] = source
    return out


def with_aliases(tensors: list[tuple[str, torch.Tensor]], option: str,
                 engine_aliases: dict[str, str] | None) -> list[tuple[str, torch.Tensor]]:
    """What to load into an engine from a received version: `tensors`, plus (alias, source tensor) for each tied
    alias the engine holds as a tensor of its own. engine_aliases: the engine's own ties (None: unknown, taken to
    be the trainer's, as for a server engine loading the same HF config)."""
    aliases = decode_aliases(option)
    if not aliases or engine_aliases is None:
        return tensors
    by_name = dict(tensors)
    extra = [(alias, by_name[source]) for alias, source in aliases.items()
             if engine_aliases.get(alias) != source and source in by_name]
    return [*tensors, *extra]
