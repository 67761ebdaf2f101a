"""Build the store a config names (buffer.store), through the store registry."""

from __future__ import annotations

from rlfleet.config import Config
from rlfleet.services.buffer.stores import Store
from rlfleet.services.buffer.stores.registry import store_kind


def open_store(cfg: Config) -> Store:
    return store_kind(cfg.buffer.store).build(cfg)
