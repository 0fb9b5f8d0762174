"""A background thread that keeps a store's `usage` current.

`store.usage` is what a store has counted itself: its own puts and deletes. Other processes
writing the same directory or Redis database, TTL expiry and Redis eviction change what is held
without telling it, so `Recounter` calls `store.recount()` (a directory listing, a Redis scan)
every few seconds off the request path; readers such as the /metrics gauges never wait on it.
"""

from __future__ import annotations

import threading

from vlcache.stores.base import Store, log


class Recounter:
    """Recounts `store` at start and then every `interval_s` seconds until `stop()`."""

    def __init__(self, store: Store, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.store = store
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vlcache-store-recount",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to end; a recount under way finishes first (up to `timeout`)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.store.recount()
            except Exception:  # a store's failure must not end the thread
                log.exception("recounting %r failed", self.store)
            self._stopping.wait(self.interval_s)
