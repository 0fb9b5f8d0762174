"""JSON lines over a pipe: the driver writes one request per line to a worker's stdin and reads
one answer per line from its stdout. Engines log to stdout (vLLM does), so a worker moves its
own stdout to stderr first and keeps a private copy of the pipe for answers."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import IO

import psutil


def open_channel() -> IO[str]:
    """In a worker, before importing an engine: the answer pipe; fd 1 becomes stderr, so
    anything printed (by this process or the engine's children) goes to the log."""
    sys.stdout.flush()
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return channel


def send(channel: IO[str], message: dict) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve(channel: IO[str], handle: Callable[[dict], dict]) -> None:
    """Answer requests from stdin until "quit" or end of input; an exception becomes an answer
    {"ok": false, "error": ...}, never the end of the worker."""
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "quit":
            break
        try:
            answer = {"ok": True, **handle(request)}
        except Exception as e:  # a failed request is data for the report
            traceback.print_exc()
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        send(channel, answer)


def thread_times(pid: int | None = None) -> dict[tuple[int, int], float]:
    """User + system CPU seconds of every thread of a process and its descendants (vLLM's
    engine core and model worker are children of its worker process)."""
    root = psutil.Process(pid)
    times = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            for t in p.threads():
                times[(p.pid, t.id)] = t.user_time + t.system_time
        except psutil.NoSuchProcess:
            pass
    return times


def cpu_used(before: dict, after: dict) -> tuple[float, float]:
    """(all threads, the busiest thread): CPU seconds between two `thread_times`. Over a
    request's wall time, the busiest thread's share says how much of a core the compute got
    (the rest of `all` is helpers: vLLM's processes poll and spin while they wait)."""
    deltas = [t - before.get(k, 0.0) for k, t in after.items()] or [0.0]
    return sum(deltas), max(deltas)


class WorkerError(RuntimeError):
    pass


class Worker:
    """The driver's handle on one engine process."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: IO) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, env=env, text=True, bufsize=1,
                                     process_group=0)  # its own group: kill() ends all
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info: dict = {}
        self.error: str | None = None  # set once the worker is dead

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._answers.put(line)
        self._answers.put(None)

    @property
    def alive(self) -> bool:
        return self.error is None and self.proc.poll() is None

    def _receive(self, timeout: float) -> dict:
        try:
            line = self._answers.get(timeout=timeout)
        except queue.Empty:
            self.kill(f"no answer within {timeout:.0f} s")
            raise WorkerError(self.error) from None
        if line is None:
            self.kill(f"exited with code {self.proc.wait()}")
            raise WorkerError(self.error)
        return json.loads(line)

    def wait_ready(self, timeout: float) -> dict:
        start = time.monotonic()
        self.info = self._receive(timeout)
        self.info["start_s"] = time.monotonic() - start
        return self.info

    def call(self, request: dict, timeout: float) -> dict:
        if not self.alive:
            raise WorkerError(self.error or "not running")
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError as e:
            self.kill(f"pipe closed ({e})")
            raise WorkerError(self.error) from None
        return self._receive(timeout)

    def kill(self, why: str) -> None:
        self.error = self.error or f"{self.name} worker {why}"
        self._kill_group()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the engine's own children too
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill_group()
