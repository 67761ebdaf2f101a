"""The one table of buffer stores (buffer.store): each store's name, what it is, and how a config opens it. A
store's module is imported only when that store is opened (redis is an optional dependency)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rlfleet.config import Config
from rlfleet.services.buffer.stores import Store


@dataclass(frozen=True)
class StoreKind:
    """One store: its name (buffer.store), a line saying where it keeps samples, and how to open it for a config."""

    name: str
    description: str
    build: Callable[[Config], Store]


def _embedded(cfg: Config) -> Store:
    from rlfleet.services.buffer.stores.embedded import EmbeddedStore

    return EmbeddedStore(cfg.run_dir / "buffer", fsync=cfg.buffer.fsync)


def _redis(cfg: Config) -> Store:
    from rlfleet.services.buffer.stores.redis_streams import RedisStore

    return RedisStore(cfg.buffer.redis_url, prefix=f"rlfleet:{cfg.run.name}:buffer",
                      durability=cfg.buffer.redis_durability)


STORES: Mapping[str, StoreKind] = MappingProxyType({s.name: s for s in (
    StoreKind("embedded", "an append-only log in the run folder (<run_dir>/buffer)", _embedded),
    StoreKind("redis", "Redis Streams at buffer.redis_url, keys under rlfleet:<run.name>:buffer", _redis),
)})


def store_kind(name: str) -> StoreKind:
    """The store called `name`; ValueError naming the known ones otherwise."""
    found = STORES.get(name)
    if found is None:
        raise ValueError(f"unknown buffer.store '{name}' (available: {', '.join(STORES)})")
    return found
