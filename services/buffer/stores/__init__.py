"""Where the buffer's state lives. A store persists mutations durably and rebuilds the State on start.

The buffer is the single writer of its store: it computes mutations under its lock, calls commit (durable when it
returns), then applies them to its in-memory State. After a failed commit the buffer reloads the State from the
store, so memory never runs ahead of what is durable.
"""

from __future__ import annotations

from typing import Protocol

from services.buffer.mutations import Mutation
from services.buffer.state import State


class StoreError(RuntimeError):
    """The store could not persist or read (disk full, Redis down). The operation may be retried."""


class Store(Protocol):
    def load(self) -> State: ...

    def commit(self, mutations: list[Mutation], state: State) -> None:
        """Persist mutations (state: before they are applied); durable when this returns."""
        ...

    def close(self) -> None: ...
