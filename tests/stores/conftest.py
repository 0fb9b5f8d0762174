"""Shared fixtures: small entries, forked child processes, and real redis-server processes."""

from __future__ import annotations

import io
import logging
import multiprocessing
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from vlcache.entry import ImageEntry

REDIS_SERVER = shutil.which("redis-server")
NO_REDIS = "redis-server not installed (CI: apt-get install -y redis-server)"


def _make_entry(n: int = 12, layers: int = 3, fill: float | None = None) -> ImageEntry:
    """A small entry; with `fill`, every float is that value (for consistency checks)."""
    def t(*shape: int) -> torch.Tensor:
        return torch.full(shape, fill) if fill is not None else torch.randn(*shape)

    return ImageEntry(
        embeds=t(n, 16),  # [N, H]
        keys=t(layers, n, 2, 8),  # [L, N, kv_heads, head_dim]
        values=t(layers, n, 2, 8),
        positions=torch.arange(3 * n).reshape(3, n),  # [3, N]
    )


def _same(a: ImageEntry | None, b: ImageEntry | None) -> bool:
    if a is None or b is None or a.tensors().keys() != b.tensors().keys():
        return False
    return all(torch.equal(t, b.tensors()[name]) for name, t in a.tensors().items())


@pytest.fixture
def make_entry() -> Callable[..., ImageEntry]:
    return _make_entry


@pytest.fixture
def same() -> Callable[[ImageEntry | None, ImageEntry | None], bool]:
    """Whether two entries hold equal tensors under the same names."""
    return _same


@pytest.fixture
def entry() -> ImageEntry:
    return _make_entry()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server on 127.0.0.1, no persistence, its files in `workdir`."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip(NO_REDIS)
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server, emptied before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    yield redis_server.url


@pytest.fixture
def spawn_redis(tmp_path: Path) -> Iterator[Callable[[], RedisServer]]:
    """Extra servers a test may kill and restart (the session one stays up)."""
    if REDIS_SERVER is None:
        pytest.skip(NO_REDIS)
    servers: list[RedisServer] = []

    def spawn() -> RedisServer:
        servers.append(RedisServer(tmp_path / f"redis{len(servers)}").start())
        return servers[-1]

    yield spawn
    for s in servers:
        s.stop()


class Child:
    """`fn(say, *args)` in a forked process (a real second process, without a second torch import).

    `say(message)` reaches the parent through `recv`; the child's return value arrives as
    `result()`, together with what it logged under vlcache.stores.
    """

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child_conn = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_child_main, args=(child_conn, fn, args), daemon=True)
        self.proc.start()
        child_conn.close()

    def recv(self, timeout: float = 60) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError("the child said nothing")
        return self._conn.recv()

    def result(self, timeout: float = 60) -> tuple[Any, str]:
        """(return value, log text); re-raises the child's exception text as an AssertionError."""
        kind, value, logs = self.recv(timeout)
        self.proc.join(timeout)
        assert kind == "ok", f"child failed:\n{value}"
        return value, logs

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()


def _child_main(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    import traceback

    torch.set_num_threads(1)  # no OpenMP pool inherited across the fork
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    logger = logging.getLogger("vlcache.stores")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        result = fn(conn.send, *args)
        conn.send(("ok", result, logs.getvalue()))
    except BaseException:
        conn.send(("error", traceback.format_exc(), logs.getvalue()))
    finally:
        conn.close()


@pytest.fixture
def fork() -> Iterator[Callable[..., Child]]:
    """Start `Child`ren; any still running at the end of the test are killed."""
    children: list[Child] = []

    def start(fn: Callable[..., Any], *args: Any) -> Child:
        children.append(Child(fn, *args))
        return children[-1]

    yield start
    for c in children:
        if c.proc.is_alive():
            c.kill()
