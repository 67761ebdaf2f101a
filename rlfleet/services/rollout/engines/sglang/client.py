"""A small blocking client for SGLang's native HTTP API (0.5.23 routes), stdlib only, a timeout on every call.

Routes used: /health, /get_model_info, /generate, /abort_request, /pause_generation, /continue_generation,
/begin_weight_update, /end_weight_update, /update_weights_from_disk, /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group, /get_weights_by_name, /flush_cache.
The weight calls answer {"success": bool, "message": str}; a false success or an HTTP error raises SGLangError.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from rlfleet.services.rollout.engines.base import EngineError


class SGLangError(EngineError):
    """An SGLang call that failed: connection refused, timeout, HTTP error or success=false."""


class SGLangClient:
    def __init__(self, base_url: str, timeout: float = 30.0, generate_timeout: float = 600.0,
                 weight_timeout: float = 600.0, api_key: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if api_key:                               # the server's --api-key: every route requires it
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout                    # control calls
        self.generate_timeout = generate_timeout  # one /generate, until its request finishes
        self.weight_timeout = weight_timeout      # weight loads and group set-up

    # ---- transport ----------------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any, timeout: float) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise SGLangError(f"SGLang {path}: HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise SGLangError(f"SGLang {path}: {type(exc).__name__}: {exc}") from exc
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def post(self, path: str, body: Any, timeout: float | None = None) -> Any:
        return self._call("POST", path, body, self.timeout if timeout is None else timeout)

    def get(self, path: str, timeout: float | None = None) -> Any:
        return self._call("GET", path, None, self.timeout if timeout is None else timeout)

    def _checked(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        out = self.post(path, body, timeout)
        if not isinstance(out, dict) or not out.get("success", False):
            raise SGLangError(f"SGLang {path} refused: {out}")
        return out

    # ---- serving ------------------------------------------------------------------------------------------------

    def healthy(self, timeout: float = 5.0) -> bool:
        """GET /health: 200 once the server is up and not shutting down."""
        try:
            self.get("/health", timeout=timeout)
            return True
        except SGLangError:
            return False

    def model_info(self) -> dict[str, Any]:
        return self.get("/get_model_info")

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        out = self.post("/generate", body, self.generate_timeout)
        if isinstance(out, list):                 # a batch answer; rlfleet sends one request per call
            out = out[0]
        return out

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        self.post("/abort_request", {"rid": rid or "", "abort_all": abort_all})

    def pause_generation(self, mode: str = "in_place") -> None:
        """mode in_place: running requests keep their KV and continue after continue_generation."""
        self.post("/pause_generation", {"mode": mode})

    def continue_generation(self) -> None:
        self.post("/continue_generation", {"torch_empty_cache": False})

    def flush_cache(self) -> bool:
        try:
            self.post("/flush_cache", {})
            return True
        except SGLangError:
            return False

    # ---- weights ------------------------------------------------------------------------------------------------

    def begin_weight_update(self) -> None:
        self._checked("/begin_weight_update", {})

    def end_weight_update(self) -> None:
        self._checked("/end_weight_update", {})

    def update_weights_from_disk(self, model_path: str, weight_version: str, flush_cache: bool) -> None:
        self._checked("/update_weights_from_disk",
                      {"model_path": model_path, "weight_version": weight_version, "flush_cache": flush_cache},
                      self.weight_timeout)

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str = "gloo") -> None:
        self._checked("/init_weights_update_group",
                      {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                       "world_size": world_size, "group_name": group_name, "backend": backend}, self.weight_timeout)

    def destroy_weights_update_group(self, group_name: str) -> None:
        self._checked("/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                        shapes: Sequence[Sequence[int]], group_name: str, weight_version: str,
                                        flush_cache: bool) -> None:
        self._checked("/update_weights_from_distributed",
                      {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                       "group_name": group_name, "weight_version": weight_version, "flush_cache": flush_cache},
                      self.weight_timeout)

    def get_weights_by_name(self, name: str, truncate_size: int) -> Any:
        """The parameter as nested lists (float32 values), its first truncate_size rows."""
        return self.post("/get_weights_by_name", {"name": name, "truncate_size": truncate_size},
                         self.weight_timeout)
