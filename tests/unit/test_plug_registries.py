"""Every weight transport, trainer backend and buffer store a config can name is found through its registry, and the
two sides of a transport (the trainer's publisher, a replica's receivers) build theirs from that one table."""

from __future__ import annotations

import logging
import typing
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel

from rlfleet.config import BufferConfig, Config, TrainerConfig, WeightSyncConfig, parse_config
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.services.buffer.stores.factory import open_store
from rlfleet.services.buffer.stores.registry import STORES, store_kind
from rlfleet.services.rollout.server import transport_receivers
from rlfleet.services.rollout.weight_updates import TransportReceivers
from rlfleet.services.trainer.backends import BACKENDS, backend_spec
from rlfleet.services.trainer.publisher import WeightPublisher, resolve_transport
from rlfleet.services.weight_sync.transports import bucketed
from rlfleet.services.weight_sync.transports.auto import candidates_here
from rlfleet.services.weight_sync.transports.disk_delta.receiver import DeltaReceiver
from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender
from rlfleet.services.weight_sync.transports.nixl.agent import available
from rlfleet.services.weight_sync.transports.registry import TRANSPORTS, transport


def _literal(model: type[BaseModel], field: str) -> set[str]:
    return set(typing.get_args(model.model_fields[field].annotation))


def test_every_configurable_transport_and_backend_is_registered() -> None:
    assert _literal(WeightSyncConfig, "transport") - {"auto"} == set(TRANSPORTS) == {
        "bucketed", "broadcast", "nixl", "disk_delta"}
    assert all(t.name == name for name, t in TRANSPORTS.items())
    assert _literal(TrainerConfig, "backend") == set(BACKENDS) == {"fsdp", "megatron"}
    with pytest.raises(ValueError, match="unknown weight transport 'carrier-pigeon'"):
        transport("carrier-pigeon")
    with pytest.raises(ValueError, match="unknown trainer.backend 'jax'"):
        backend_spec("jax")


def _config(tmp_path: Path) -> Config:
    return parse_config({"run": {"dir": str(tmp_path / "run")}, "model": {"path": str(tmp_path)},
                         "rollout": {"data_source": "x:y", "reward_fn": "x:y", "replicas": 3},
                         "trainer": {"backend": "megatron", "world_size": 8,
                                     "megatron": {"tensor_parallel": 2, "pipeline_parallel": 2}},
                         "weight_sync": {"transport": "disk_delta"}})


def test_the_publisher_and_the_replica_take_their_halves_from_the_registry(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    assert backend_spec("megatron").data_parallel_size(cfg, 8) == 2                 # 8 ranks / (TP 2 * PP 2)
    assert backend_spec("fsdp").data_parallel_size(cfg, 8) == 8
    publisher = WeightPublisher(cfg, None, weight_sync=None)  # type: ignore[arg-type]  # publish() is not called
    assert isinstance(publisher.sender, DeltaSender) and publisher.transport == "disk_delta"
    publisher.close()

    class Holder:                      # what a receiver may see of a replica: version and tensors, no engine
        weight_version = 4

        def named_weights(self) -> list[tuple[str, torch.Tensor]]:
            return [("w", torch.zeros(2))]

    receivers = TransportReceivers(Holder(), "r0", None, ("bucketed", "disk_delta", "broadcast", "nixl"))
    assert set(receivers.receivers) == {"bucketed", "disk_delta"}   # the others need the control plane
    assert isinstance(receivers.receivers["disk_delta"], DeltaReceiver)
    assert isinstance(receivers.receivers["bucketed"], bucketed.StreamReceiver)    # keeps its channel
    assert receivers("bucketed") == receivers.receivers["bucketed"].fetch
    assert TransportReceivers(Holder(), "r0", None, ("disk_delta",))("bucketed") is bucketed.fetch   # not set up
    with pytest.raises(ValueError, match="needs a replica-side receiver"):
        receivers("nixl")
    receivers.close()


def test_every_configurable_buffer_store_is_registered_and_opened_through_it(tmp_path: Path) -> None:
    assert _literal(BufferConfig, "store") == set(STORES) == {"embedded", "redis"}
    assert all(s.name == name and s.description for name, s in STORES.items())
    with pytest.raises(ValueError, match="unknown buffer.store 'floppy'"):
        store_kind("floppy")
    store = open_store(_config(tmp_path))                                         # buffer.store: embedded
    assert isinstance(store, EmbeddedStore)
    store.close()


def test_auto_weighs_what_each_transport_declares(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    declared = {name: t.auto for name, t in TRANSPORTS.items() if t.auto is not None}
    assert list(declared) == ["broadcast", "disk_delta", "nixl"]                     # the order auto probes them in
    assert {n: (a.fixed_seconds, a.bytes_fraction) for n, a in declared.items()} == {
        "broadcast": (0.05, 1.0), "disk_delta": (0.2, 0.15), "nixl": (0.25, 1.0)}
    assert [name for name, t in TRANSPORTS.items() if t.always_received] == ["bucketed"]
    candidates = candidates_here()
    assert list(candidates.here) + list(candidates.missing) == list(declared)
    assert ("nixl" in candidates.missing) == (available() is not None)

    cfg = _config(tmp_path).model_copy(update={"weight_sync": WeightSyncConfig(transport="auto")})
    with caplog.at_level(logging.INFO, logger="rlfleet.services.trainer.publisher"):
        assert resolve_transport(cfg, 1 << 20) in candidates.here
    assert "transport auto chose" in caplog.text
    assert ("transport auto: nixl is not a candidate" in caplog.text) == ("nixl" in candidates.missing)

    class Holder:
        weight_version = 0

        def named_weights(self) -> list[tuple[str, torch.Tensor]]:
            return [("w", torch.zeros(2))]

    receivers = transport_receivers(cfg, Holder(), "r0", None)  # type: ignore[arg-type]  # no control plane
    assert set(receivers.receivers) == {"disk_delta", "bucketed"}        # broadcast and nixl need the control plane
    receivers.close()
