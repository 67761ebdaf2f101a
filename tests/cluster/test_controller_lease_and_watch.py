"""Leader election through a Lease, and list+watch that lists again when the watch answers 410 Gone — both
against kmock's in-memory API through the official client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.cluster.tools import need_module

need_module("kubernetes", module_level=True)
need_module("kmock", module_level=True)

import kmock  # noqa: E402
from kubernetes import client  # noqa: E402

from rlfleet.services.controller.leader import LeaseElector  # noqa: E402
from rlfleet.services.controller.watcher import ListWatch  # noqa: E402
from tests.cluster.controller_rig import Clock  # noqa: E402
from tests.cluster.k8s_objects import NAMESPACE, pod  # noqa: E402
from tests.cluster.kmock_server import KmockApi  # noqa: E402


@pytest.fixture()
def api() -> Iterator[KmockApi]:
    need_module("kmock")
    server = KmockApi().start()
    yield server
    server.stop()


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)


def _holder(api: KmockApi) -> str:
    lease = client.CoordinationV1Api(api.api_client()).read_namespaced_lease("run1-controller", NAMESPACE,
                                                                             _preload_content=False)
    return json.loads(lease.data)["spec"]["holderIdentity"]


def test_one_leader_until_its_lease_lapses(api: KmockApi) -> None:
    clock = Clock(now=1_000.0)
    coord = client.CoordinationV1Api(api.api_client())
    a = LeaseElector(coord, NAMESPACE, "run1-controller", "controller-a", 15, clock)
    b = LeaseElector(coord, NAMESPACE, "run1-controller", "controller-b", 15, clock)
    assert a.try_acquire() and not b.try_acquire()
    clock.now += 10
    assert a.try_acquire(), "the holder renews"
    assert not b.try_acquire() and _holder(api) == "controller-a"
    clock.now += 16                                  # a stopped renewing (crashed): its lease lapses
    assert b.try_acquire() and _holder(api) == "controller-b"
    assert not a.try_acquire(), "the old leader stands down"
    lease = json.loads(coord.read_namespaced_lease("run1-controller", NAMESPACE, _preload_content=False).data)
    assert lease["spec"]["leaseTransitions"] == 1 and lease["spec"]["leaseDurationSeconds"] == 15


def test_watch_lists_again_after_410_gone(api: KmockApi) -> None:
    core = client.CoreV1Api(api.api_client())
    core.create_namespaced_pod(NAMESPACE, pod("run1-trainer-0", "trainer", "n0"))
    gone = {"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version"}}
    api.call(lambda em: em[kmock.action.WATCH, kmock.resource("v1/pods")][:1] << (gone,))
    relists: list[str] = []
    changed = threading.Event()
    lw = ListWatch(core.list_namespaced_pod, "pods", changed.set, relists.append, timeout_seconds=2,
                   namespace=NAMESPACE)

    lw.run_once()                                     # list, then the watch answers 410
    assert relists == ["pods"] and lw.lists == 1
    assert set(lw.objects) == {"run1-trainer-0"}

    thread = threading.Thread(target=lw.run_once, daemon=True)  # lists again, then watches for real
    thread.start()
    _wait_for(lambda: lw.lists == 2)
    core.create_namespaced_pod(NAMESPACE, pod("run1-trainer-1", "trainer", "n1"))
    _wait_for(lambda: "run1-trainer-1" in lw.objects)
    assert lw.lists == 2 and set(lw.objects) == {"run1-trainer-0", "run1-trainer-1"}
    core.delete_namespaced_pod("run1-trainer-0", NAMESPACE)
    _wait_for(lambda: "run1-trainer-0" not in lw.objects)
    assert set(lw.objects) == {"run1-trainer-1"}
    lw.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    lists = [r for r in api.requests() if str(r.action).endswith("LIST") and r.resource.plural == "pods"]
    assert len(lists) == 2
