"""A queue that serves many clients in turn, so one busy client cannot starve the others."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class FairQueue:
    """Requests queued per client and taken one client at a time, in turn."""

    def __init__(self) -> None:
        self._items: dict[str, deque[Any]] = {}
        self._turns: deque[str] = deque()
        self._cond = threading.Condition()

    def put(self, client: str, item: Any) -> None:
        with self._cond:
            if client not in self._items:
                self._items[client] = deque()
                self._turns.append(client)
            self._items[client].append(item)
            self._cond.notify_all()

    def take(self) -> Any | None:
        """The next client's oldest item, or None when empty."""
        with self._cond:
            if not self._turns:
                return None
            client = self._turns.popleft()
            item = self._items[client].popleft()
            if self._items[client]:
                self._turns.append(client)
            else:
                del self._items[client]
            return item

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._items.values())

    def wait(self, timeout_s: float) -> None:
        """Waits until something is queued (or ``timeout_s``)."""
        with self._cond:
            if not self._turns:
                self._cond.wait(timeout_s)
