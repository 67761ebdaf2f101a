"""buffer.redis_durability: the buffer (a real process) refuses a real redis-server that does not fsync every write
(appendfsync everysec, or no AOF) unless the field turns durability down by name; then it starts with a warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis

from rlfleet.services.buffer.stores.redis_durability import WeakDurability, check_durability
from tests.integration.test_buffer_service import ROOT, BufferProcess, write_config
from tests.support.redis_server import RedisServer, free_port


def start_buffer(run_dir: Path, redis_url: str, **buffer: object) -> subprocess.CompletedProcess[str]:
    """Run the buffer until it exits on its own (a refusal) or 60 s pass."""
    cfg = write_config(run_dir, free_port(), store="redis", redis_url=redis_url, **buffer)
    return subprocess.run([sys.executable, "-m", "rlfleet.services.buffer", "--config", str(cfg)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_everysec_is_refused_naming_the_field(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", args=("--appendfsync", "everysec")).start()
    try:
        done = start_buffer(tmp_path / "run", server.url)
        epoch = redis.Redis.from_url(server.url).get("rlfleet:t:buffer:epoch")
    finally:
        server.stop()
    assert done.returncode != 0, done.stderr
    assert "appendfsync everysec" in done.stderr and "buffer.redis_durability: everysec_loses_1s" in done.stderr, \
        done.stderr
    assert epoch is None                                  # refused before it took a writer epoch


def test_everysec_with_the_opt_out_starts_with_a_warning(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", args=("--appendfsync", "everysec")).start()
    port = free_port()
    cfg = write_config(tmp_path / "run", port, store="redis", redis_url=server.url,
                       redis_durability="everysec_loses_1s")
    buffer = BufferProcess(cfg, port)
    try:
        buffer.start()                                     # serving: healthy
        assert buffer.terminate() == 0
    finally:
        if buffer.proc is not None and buffer.proc.poll() is None:
            buffer.kill9()
        server.stop()
    log = buffer.log.read_text()
    assert "appendfsync everysec accepted (buffer.redis_durability: everysec_loses_1s)" in log, log


def test_each_setting_against_each_level(tmp_path: Path) -> None:
    """The table: which server settings each level accepts (a real redis-server, reconfigured with CONFIG SET)."""
    server = RedisServer(tmp_path / "redis").start()
    r = redis.Redis.from_url(server.url, decode_responses=True)
    expected = {("yes", "always"): {"always", "everysec_loses_1s", "unchecked_may_lose_writes"},
                ("yes", "everysec"): {"everysec_loses_1s", "unchecked_may_lose_writes"},
                ("yes", "no"): {"unchecked_may_lose_writes"},
                ("no", "always"): {"unchecked_may_lose_writes"}}
    try:
        for (aof, fsync), accepted in expected.items():
            r.config_set("appendonly", aof)
            r.config_set("appendfsync", fsync)
            for level in ("always", "everysec_loses_1s", "unchecked_may_lose_writes"):
                try:
                    check_durability(r, level)
                    ok = True
                except WeakDurability as exc:
                    assert "buffer.redis_durability" in str(exc)
                    ok = False
                assert ok == (level in accepted), (aof, fsync, level)
    finally:
        r.close()
        server.stop()


def test_an_acl_user_without_config_is_checked_through_info(tmp_path: Path) -> None:
    """The chart's buffer user may not run CONFIG (-@dangerous): the AOF is checked through INFO, fsync unverified."""
    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    admin.acl_setuser("buf", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all", "-@dangerous", "+info"])
    user = redis.Redis(port=server.port, username="buf", password="pw", decode_responses=True)
    try:
        check_durability(user, "always")                  # AOF on: accepted, with a warning
        admin.config_set("appendonly", "no")
        try:
            check_durability(user, "always")
            refused = ""
        except WeakDurability as exc:
            refused = str(exc)
        check_durability(user, "unchecked_may_lose_writes")
    finally:
        user.close()
        admin.close()
        server.stop()
    assert "appendonly no" in refused and "buffer.redis_durability" in refused, refused
