"""Build the store a config names."""

from __future__ import annotations

from rlfleet.config import Config
from rlfleet.services.buffer.stores import Store


def open_store(cfg: Config) -> Store:
    if cfg.buffer.store == "redis":
        from rlfleet.services.buffer.stores.redis_streams import RedisStore

        return RedisStore(cfg.buffer.redis_url, prefix=f"rlfleet:{cfg.run.name}:buffer")
    from rlfleet.services.buffer.stores.embedded import EmbeddedStore

    return EmbeddedStore(cfg.run_dir / "buffer", fsync=cfg.buffer.fsync)
