"""A full disk (RLIMIT_FSIZE on this process: writes past it fail with EFBIG, as a full disk fails with ENOSPC):
the embedded log compacts at once when that makes room, health stays failing while a real commit cannot be written,
and the buffer's metrics log drops and counts what it cannot write instead of raising out of the serve loop."""

from __future__ import annotations

import argparse
from pathlib import Path

from prometheus_client import CollectorRegistry

from rlfleet.config import load_config
from rlfleet.runtime.metrics import BufferMetrics, JsonlLog, read_jsonl
from rlfleet.runtime.service_main import ServiceArgs
from rlfleet.security.credentials import load_credential
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import BufferServer, write_stats
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore
from tests.integration.test_buffer_contract import make_sample
from tests.integration.test_buffer_service import write_config
from tests.support.redis_server import free_port
from tests.unit.test_buffer_durability import SETTINGS, FileSizeLimit, fill_ready, fingerprint, open_core, run_steps


def test_a_log_that_fills_the_disk_is_compacted_at_once_and_puts_go_on(tmp_path: Path) -> None:
    """Most of the log is delivered and acknowledged groups; the next compaction is due at 64 MB, which the disk
    cannot hold. Once, the failed append moved nothing and every Put failed (and the 12-byte health probe too)
    until space returned."""
    core = open_core(tmp_path)
    run_steps(core, 40)
    store = core.store
    assert isinstance(store, EmbeddedStore)
    size = store.log_bytes
    (t,) = core.claim("r", 0, 1, 0).tickets
    with FileSizeLimit(size):                    # not a byte more than the log's commits: the disk is full
        reply = core.put([make_sample(t.group_id, i, 2) for i in range(2)], 0)
        assert reply.accepted == 2
        assert core.healthy()
        run_steps(core, 2)
        assert store.log_bytes < size
        want = fingerprint(core.state)
    core.close()
    assert fingerprint(open_core(tmp_path).state) == want
    assert (tmp_path / LOG_NAME).stat().st_size < size


def test_health_fails_while_a_real_commit_cannot_be_written(tmp_path: Path) -> None:
    """Room for the 12-byte probe commit, none for a Put: health once said SERVING while every Put failed."""
    core = open_core(tmp_path)
    fill_ready(core, 3)                           # nothing delivered: compaction frees nothing
    store = core.store
    assert isinstance(store, EmbeddedStore)
    (t,) = core.claim("r", 0, 1, 0).tickets
    big = [make_sample(t.group_id, i, 2, tokens=2000) for i in range(2)]
    with FileSizeLimit(store.log_bytes + 64):
        for _ in range(3):
            try:
                core.put(big, 0)
                raise AssertionError("a Put past the full disk was written")
            except Exception as exc:             # StoreError: the disk is full
                assert "buffer log" in str(exc)
            assert not core.healthy()
            assert not core.healthy()             # probed again: still no room for the commit that failed
    assert core.healthy()                         # space returned: room for it is written, then the probe
    assert core.put(big, 0).accepted == 2
    want = fingerprint(core.state)
    core.close()
    assert fingerprint(BufferCore(EmbeddedStore(tmp_path), SETTINGS).state) == want


def test_the_metrics_log_drops_and_counts_what_a_full_disk_refuses(tmp_path: Path) -> None:
    core = open_core(tmp_path / "buffer")
    fill_ready(core, 2)
    registry = CollectorRegistry()
    metrics = BufferMetrics(registry)
    path = tmp_path / "metrics" / "buffer.jsonl"
    jsonl = JsonlLog(path, on_error=lambda exc: metrics.dropped_log_records.inc())
    write_stats(core, jsonl)
    size = path.stat().st_size
    with FileSizeLimit(size + 10):               # part of one more line fits, then nothing
        for _ in range(3):
            write_stats(core, jsonl)             # once: EFBIG out of the buffer's serve loop
    assert jsonl.dropped == 3
    assert registry.get_sample_value("rlfleet_buffer_dropped_log_records_total") == 3
    write_stats(core, jsonl)                     # space returned: on a line of its own after the torn one
    jsonl.close()
    records = read_jsonl(path)
    assert [r["ready_groups"] for r in records] == [2, 2]
    assert path.read_text().count("\n") == 3     # two records and the torn line between them
    core.close()


def test_the_buffer_service_keeps_serving_when_its_metrics_log_cannot_be_written(tmp_path: Path) -> None:
    """The running buffer (BufferServer, in-process on a free port) writes its stats record each 10 s from the serve
    loop; on a full disk that write once raised EFBIG/ENOSPC out of the loop and the buffer exited."""
    run_dir = tmp_path / "run"
    cfg_path = write_config(run_dir, free_port())
    cfg = load_config(cfg_path)
    args = ServiceArgs(config=cfg, config_path=cfg_path, listen=None, metrics_port=0,
                       token=load_credential(cfg.security, "buffer"), extra=argparse.Namespace())
    server = BufferServer(args)
    try:
        server._write_stats()
        path = run_dir / "metrics" / "buffer.jsonl"
        with FileSizeLimit(path.stat().st_size):
            for _ in range(2):
                server._write_stats()            # the serve loop's tick
        assert server.metrics is not None
        assert server.metrics.dropped_log_records._value.get() == 2
        server._write_stats()
    finally:
        server.signalled(15)
        server.close()
    assert len(read_jsonl(path)) == 2
