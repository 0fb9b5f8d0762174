"""/metrics never waits on the store: it reads the store's own counts (issue 22)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL, ask, live_server, random_image
from tests.stores.conftest import REDIS_SERVER, RedisServer
from vlcache.engine import Engine
from vlcache.server import ServerConfig
from vlcache.stores.memory import MemoryStore

SLOW_S = 2.0


class SlowToCount(MemoryStore):
    """A store whose full counts are slow, as a large directory or Redis database is."""

    @property
    def nbytes(self) -> int:
        time.sleep(SLOW_S)
        return super().nbytes

    def keys(self):
        time.sleep(SLOW_S)
        return super().keys()


def _scrape(base: str) -> tuple[float, dict[str, float]]:
    t = time.perf_counter()
    text = httpx.get(f"{base}/metrics", timeout=30).text
    took = time.perf_counter() - t
    return took, {s.name: s.value for f in text_string_to_metric_families(text)
                  for s in f.samples}


def test_scrape_does_not_count_the_store(checkpoint):
    engine = Engine.from_pretrained(checkpoint, store=SlowToCount())
    with live_server(engine, ServerConfig(MODEL)) as base:
        r = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                       json={"messages": ask(random_image(3), "hi"), "max_tokens": 2})
        assert r.status_code == 200
        took, values = _scrape(base)
    assert took < SLOW_S / 2, f"/metrics took {took:.2f} s"
    assert values["vlcache_store_entries"] == engine.store.usage.entries >= 1
    assert values["vlcache_store_bytes"] == engine.store.usage.bytes > 0


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server not installed")
def test_scrape_and_health_with_redis_frozen(checkpoint, tmp_path):
    pytest.importorskip("redis")
    redis = RedisServer(tmp_path / "redis").start()
    try:
        engine = Engine.from_pretrained(checkpoint, store=f"{redis.url}?timeout=2s")
        config = ServerConfig(MODEL, store_recount_s=0.1)
        with live_server(engine, config) as base:
            r = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                           json={"messages": ask(random_image(4), "hi"), "max_tokens": 2})
            assert r.status_code == 200
            os.kill(redis.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(0.3)  # a background recount is now stuck on the frozen server
                worst = max(_scrape(base)[0] for _ in range(5))
                t = time.perf_counter()
                assert httpx.get(f"{base}/health", timeout=30).status_code == 200
                health = time.perf_counter() - t
            finally:
                os.kill(redis.proc.pid, signal.SIGCONT)
    finally:
        redis.stop()
    assert worst < 0.5 and health < 0.5, (worst, health)
