"""Fixtures for the integration's tests: encoder outputs, and the repository's real
redis-server fixture (tests/stores/conftest.py) reused, not rewritten."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:  # `tests` is a package at the repository root
    sys.path.insert(0, str(REPO))

from tests.stores.conftest import NO_REDIS, REDIS_SERVER, RedisServer  # noqa: E402


@pytest.fixture
def output() -> torch.Tensor:
    """An encoder output as vLLM hands it over: [N, W]."""
    return torch.randn(64, 96)


@pytest.fixture
def disk_address(tmp_path: Path) -> str:
    return f"disk://{tmp_path / 'ec'}"


@pytest.fixture(scope="session")
def ec_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip(NO_REDIS)
    server = RedisServer(tmp_path_factory.mktemp("ec-redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(ec_redis_server: RedisServer) -> str:
    """The session server, emptied before each test."""
    import redis

    client = redis.Redis.from_url(ec_redis_server.url)
    client.flushdb()
    client.close()
    return ec_redis_server.url
