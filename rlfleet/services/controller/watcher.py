"""List, then watch from the list's resourceVersion; on 410 Gone (the version expired) list again."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch

from rlfleet.services.controller.kube import status_of

log = logging.getLogger("rlfleet.controller")


class ListWatch:
    """Keeps `objects` (name -> JSON) current for one resource and calls on_change after every change."""

    def __init__(self, list_fn: Callable[..., Any], resource: str, on_change: Callable[[], None],
                 on_relist: Callable[[str], None], timeout_seconds: int = 300, **list_kwargs: Any) -> None:
        self.list_fn = list_fn
        self.resource = resource
        self.on_change = on_change
        self.on_relist = on_relist
        self.timeout_seconds = timeout_seconds
        self.list_kwargs = list_kwargs
        self.objects: dict[str, dict[str, Any]] = {}
        self.lists = 0
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None

    def relist(self) -> str | None:
        data = json.loads(self.list_fn(_preload_content=False, **self.list_kwargs).data)
        self.objects = {o["metadata"]["name"]: o for o in data.get("items", [])}
        self.lists += 1
        self.on_change()
        return (data.get("metadata") or {}).get("resourceVersion")

    def run_once(self) -> None:
        """One list and one watch until it ends: normally, or with 410 (then the caller lists again)."""
        rv = self.relist()
        self._watch = watch.Watch()
        kwargs = dict(self.list_kwargs, timeout_seconds=self.timeout_seconds)
        if rv:
            kwargs["resource_version"] = rv
        try:
            for event in self._watch.stream(self.list_fn, **kwargs):
                obj = event.get("raw_object") or {}
                name = (obj.get("metadata") or {}).get("name")
                if event.get("type") == "DELETED":
                    if name:
                        self.objects.pop(name, None)
                elif name:
                    self.objects[name] = obj
                self.on_change()
                if self._stop.is_set():
                    break
        except client.ApiException as exc:
            if status_of(exc) != 410:
                raise
            log.info("watch of %s expired (410 Gone): listing again", self.resource)
            self.on_relist(self.resource)
        except Exception:
            if not self._stop.is_set():   # stop() closes the stream under the reader: that is no error
                raise

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - an API hiccup must not kill the watch thread
                log.warning("watch of %s failed (%s); retrying", self.resource, exc)
                self._stop.wait(2.0)

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
