"""One model worker thread behind a bounded FIFO queue (the engine is not thread-safe).

Handlers submit a `Job`; the worker runs jobs one at a time and posts their events (text deltas,
then the result, or an error) to the job's asyncio queue on the server's event loop. Cancelling a
waiting job takes it out of the queue at once; a running job stops at its next text delta, as
does one past its deadline (even if nobody cancels it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from vlcache.engine import Engine
from vlcache.server.errors import APIError

log = logging.getLogger("vlcache.server")

EventKind = Literal["delta", "done", "error"]


class QueueFull(Exception):
    """The queue holds `max_queue` jobs; try again in `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("the request queue is full")
        self.retry_after = retry_after


@dataclass(eq=False)
class Job:
    """One request for the worker: engine messages and sampling keywords."""

    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    deadline: float  # time.monotonic() after which the job is abandoned
    events: asyncio.Queue[tuple[EventKind, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None

    @property
    def abandoned(self) -> bool:
        return self.cancelled.is_set() or time.monotonic() > self.deadline

    def emit(self, kind: EventKind, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop has closed: nobody is waiting any more
            pass


class ModelWorker:
    """Owns the engine; `submit` jobs from any thread, they run in arrival order."""

    def __init__(self, engine: Engine, max_queue: int) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._cond = threading.Condition()
        self._stopping = False
        self._seconds_per_job = 1.0  # running mean, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="vlcache-model", daemon=True)

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the one running)."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return self._running is not None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new jobs, cancel the waiting ones, let the running one finish its token."""
        with self._cond:
            self._stopping = True
            if self._running is not None:
                self._running.cancelled.set()
            for job in self._waiting:
                job.cancelled.set()
                job.emit("error", APIError(503, "the server is shutting down",
                                           code="shutting_down"))
            self._waiting.clear()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping or len(self._waiting) >= self.max_queue:
                raise QueueFull(self._retry_after())
            self._waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Stop `job` wherever it is; its slot is free when this returns (or at its next token)."""
        job.cancelled.set()
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                pass

    def _retry_after(self) -> int:
        return max(1, min(60, math.ceil(self._seconds_per_job * (len(self._waiting) + 1))))

    def _take(self) -> Job | None:
        with self._cond:
            while not self._waiting and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            self._running = self._waiting.popleft()
            return self._running

    def _loop(self) -> None:
        while (job := self._take()) is not None:
            job.started = time.monotonic()
            try:
                self._run(job)
            finally:
                spent = time.monotonic() - job.started
                with self._cond:
                    self._running = None
                    self._seconds_per_job = 0.8 * self._seconds_per_job + 0.2 * spent

    def _run(self, job: Job) -> None:
        if job.abandoned:
            return
        try:
            stream = self.engine.stream(job.messages, should_stop=lambda: job.abandoned,
                                        **job.sampling)
            for delta in stream:
                if job.abandoned:
                    return  # the abandoned generator is closed as it goes out of scope
                if delta.text:
                    job.emit("delta", delta.text)
                if delta.result is not None:
                    job.emit("done", delta.result)
        except Exception as e:  # RequestError or a bug: the handler turns it into an answer
            job.emit("error", e)


def queue_wait(job: Job) -> float:
    """Seconds `job` waited before the worker took it."""
    return (job.started or time.monotonic()) - job.submitted

