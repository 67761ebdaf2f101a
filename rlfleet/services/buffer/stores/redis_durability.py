"""The Redis store's durability check: the server must fsync every write unless buffer.redis_durability says not.

With appendonly yes and appendfsync always, Redis replies to EXEC only after the AOF fsync, so every acknowledged
Put, delivery and Ack survives a power loss of the Redis host. Anything weaker loses acknowledged work on power
loss, so the buffer refuses it unless the config turns durability down by name:
  always                     appendonly yes + appendfsync always, else refused (the default)
  everysec_loses_1s          also appendfsync everysec (loses up to ~1 s of acknowledged writes), with a warning
  unchecked_may_lose_writes  anything (appendfsync no, no AOF at all), with a warning
CONFIG GET is denied on many managed Redis services (the chart's ACL user is allowed `config|get`): then appendfsync
cannot be read; the check falls back to INFO persistence (refused when the AOF is off, under the first two) and
warns that appendfsync is unverified.
"""

from __future__ import annotations

import logging
from typing import Literal

import redis

Durability = Literal["always", "everysec_loses_1s", "unchecked_may_lose_writes"]
ACCEPTED: dict[str, tuple[str, ...]] = {"always": ("always",), "everysec_loses_1s": ("always", "everysec"),
                                        "unchecked_may_lose_writes": ("always", "everysec", "no")}
FIELD = "buffer.redis_durability"

log = logging.getLogger(__name__)


class WeakDurability(RuntimeError):
    """Redis persists less than buffer.redis_durability requires: the buffer must not start (not retried)."""


def _settings(r: redis.Redis) -> tuple[str | None, str | None]:
    """(appendonly, appendfsync) from CONFIG GET; (aof_enabled as yes/no, None) from INFO where CONFIG is denied."""
    try:
        aof = r.config_get("appendonly").get("appendonly")
        fsync = r.config_get("appendfsync").get("appendfsync")
        return aof, fsync
    except redis.ResponseError:            # NOPERM (an ACL without CONFIG) or an unknown command (managed Redis)
        pass
    try:
        enabled = r.info("persistence").get("aof_enabled")
    except redis.ResponseError:
        return None, None
    return ("yes" if int(enabled) else "no") if enabled is not None else None, None


def check_durability(r: redis.Redis, durability: Durability) -> None:
    """Raise WeakDurability when the server persists less than `durability` requires; warn when it is weaker than
    appendfsync always but accepted, or when the setting cannot be read."""
    aof, fsync = _settings(r)
    strict = durability != "unchecked_may_lose_writes"
    if aof is not None and aof != "yes" and strict:
        raise WeakDurability(f"redis store: the Redis server runs with appendonly {aof}: a restart of redis-server "
                             f"loses every acknowledged sample. Run it with --appendonly yes --appendfsync always, or "
                             f"set {FIELD}: unchecked_may_lose_writes to accept that")
    if fsync is not None and fsync not in ACCEPTED[durability]:
        weaker = "everysec_loses_1s" if fsync == "everysec" else "unchecked_may_lose_writes"
        raise WeakDurability(f"redis store: the Redis server runs with appendfsync {fsync}: a power loss of its host "
                             f"loses acknowledged samples, deliveries and acks ({FIELD} is {durability}). Run it with "
                             f"--appendfsync always, or set {FIELD}: {weaker} to accept that loss")
    if aof is None or fsync is None:
        log.warning("redis store: CONFIG GET is not allowed, so appendfsync cannot be checked (appendonly %s); "
                    "unless the server runs --appendonly yes --appendfsync always a power loss of its host loses "
                    "acknowledged samples", aof or "unknown")
    elif aof != "yes" or fsync != "always":
        log.warning("redis store: appendonly %s, appendfsync %s accepted (%s: %s): a power loss of the Redis host "
                    "loses acknowledged samples (up to ~1 s with everysec)", aof, fsync, FIELD, durability)
