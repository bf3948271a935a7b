"""Files the ranker maps (item vectors, learnt recall tables), swapped when they change on disk."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class ReloadOnChange:
    """Cheap enough for every request: at most every `check_every_s`, compare the
    files' stamp with the one loaded and, when it changed, `refresh` in a thread
    while requests keep using what is loaded (a reader never sees half of it)."""

    def __init__(self, check_every_s: float) -> None:
        self._check_every_s = check_every_s
        self._next_check = 0.0
        self._stamp: Any = None
        self._loading: asyncio.Task[bool] | None = None

    def _disk_stamp(self) -> Any:
        raise NotImplementedError

    def _load(self) -> bool:
        """Load what is on disk now; True when what is served changed."""
        raise NotImplementedError

    def refresh(self) -> bool:
        """Load when the stamp changed since the last load; True when what is served changed."""
        stamp = self._disk_stamp()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return self._load()

    def refresh_in_background(self) -> None:
        now = time.monotonic()
        if now < self._next_check or (self._loading is not None and not self._loading.done()):
            return
        self._next_check = now + self._check_every_s
        if self._disk_stamp() != self._stamp:
            self._loading = asyncio.get_running_loop().create_task(asyncio.to_thread(self.refresh))
