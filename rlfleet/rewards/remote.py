"""`reward_fn: remote`: score each sample by POSTing it to an HTTP reward service (e.g. a code-execution sandbox).

Request body (JSON): {"prompt": text or null, "messages": [...] or null, "completion": str, "label": str or null,
"extras": {column: value}}. Reply: {"reward": float} or {"parts": {name: float}}. A service that does not answer
within `timeout` seconds, answers an HTTP error or a malformed body raises, which fails that sample only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlfleet.protocols import Prompt


def remote(url: str, timeout: float = 30.0, token_file: str | None = None) -> Callable[..., Any]:
    """token_file: a file whose content is sent as `Authorization: Bearer ...`."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"remote reward: url {url!r} must start with http:// or https://")
    headers = {"Content-Type": "application/json"}
    if token_file:
        headers["Authorization"] = f"Bearer {Path(token_file).read_text().strip()}"

    def reward(prompt: Prompt, completion: str, sample: Any, **extras: Any) -> float | dict[str, float]:
        body = json.dumps({"prompt": prompt.text, "messages": [dict(m) for m in prompt.messages or ()] or None,
                           "completion": completion, "label": prompt.label, "extras": extras}, default=str)
        req = urllib.request.Request(url, data=body.encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                reply = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"reward service {url} answered HTTP {exc.code}: {exc.read()[:200]!r}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise RuntimeError(f"reward service {url} did not answer: {exc}") from None
        if isinstance(reply, Mapping) and isinstance(reply.get("parts"), Mapping):
            return {str(k): float(v) for k, v in reply["parts"].items()}
        if isinstance(reply, Mapping) and isinstance(reply.get("reward"), int | float):
            return float(reply["reward"])
        raise ValueError(f"reward service {url}: expected {{'reward': number}} or {{'parts': {{...}}}}, got "
                         f"{str(reply)[:200]}")

    return reward
