"""Prometheus metrics for one server, in their own registry (several servers may share a
process, as in the tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from vlcache.engine.stats import RequestStats
from vlcache.server.errors import APIError
from vlcache.stores.base import Store

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
             "/version")


class Metrics:
    """Counters the HTTP layer updates, and gauges read when /metrics is scraped.

    A scrape only reads values kept in memory (the store's `usage` included, which a background
    `Recounter` refreshes), so it never waits on the store's backend.
    """

    def __init__(self, store: Store, queue_depth: Callable[[], int],
                 busy: Callable[[], bool]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("vlcache_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("vlcache_errors", "Error answers by OpenAI error type and code",
                              ["type", "code"], registry=r)
        self.image_hits = Counter("vlcache_image_cache_hits",
                                  "Images whose encoder output came from the store", registry=r)
        self.image_misses = Counter("vlcache_image_cache_misses",
                                    "Distinct images the vision tower encoded", registry=r)
        self.images_kv_reused = Counter("vlcache_images_kv_reused",
                                        "Images whose KV was reused", registry=r)
        self.cached_tokens = Counter("vlcache_cached_tokens",
                                     "Prompt tokens reused (sum of usage cached_tokens)",
                                     registry=r)
        self.tokens_recomputed = Counter("vlcache_image_tokens_recomputed",
                                         "Tokens of reused images recomputed (layer mean)",
                                         registry=r)
        self.prompt_tokens = Counter("vlcache_prompt_tokens", "Prompt tokens served", registry=r)
        self.completion_tokens = Counter("vlcache_completion_tokens", "Completion tokens",
                                         registry=r)
        self.ttft = Histogram("vlcache_ttft_seconds", "Engine time to first token",
                              buckets=SECONDS, registry=r)
        self.prepare = Histogram("vlcache_prepare_seconds",
                                 "Prompt building: images decoded and keyed, text tokenized",
                                 buckets=SECONDS, registry=r)
        self.vision = Histogram("vlcache_vision_tower_seconds",
                                "Vision-tower time of requests that ran it", buckets=SECONDS,
                                registry=r)
        self.queue_wait = Histogram("vlcache_queue_wait_seconds", "Wait for the model worker",
                                    buckets=SECONDS, registry=r)
        Gauge("vlcache_queue_depth", "Requests waiting for the model worker",
              registry=r).set_function(queue_depth)
        Gauge("vlcache_worker_busy", "1 while the model worker runs a request",
              registry=r).set_function(lambda: float(busy()))
        Gauge("vlcache_store_bytes", "Bytes held by the cache store (as last counted)",
              registry=r).set_function(lambda: store.usage.bytes)
        Gauge("vlcache_store_entries", "Entries held by the cache store (as last counted)",
              registry=r).set_function(lambda: store.usage.entries)
        r.register(_StoreCounters(store))

    def observe(self, stats: RequestStats, queue_s: float) -> None:
        """Account one completed request."""
        self.image_hits.inc(stats.images_hit)
        self.image_misses.inc(stats.images_missed)
        self.images_kv_reused.inc(stats.images_kv_reused)
        self.cached_tokens.inc(stats.cached_tokens)
        self.tokens_recomputed.inc(stats.image_tokens_recomputed)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.completion_tokens.inc(stats.completion_tokens)
        self.ttft.observe(stats.ttft_s)
        self.prepare.observe(stats.prepare_s)
        self.queue_wait.observe(queue_s)
        if stats.images_missed:
            self.vision.observe(stats.vision_s)

    def error(self, e: APIError) -> None:
        self.errors.labels(e.type, e.code or "").inc()

    def request(self, path: str, status: int) -> None:
        self.requests.labels(path if path in ENDPOINTS else "other", str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCounters(Collector):
    """The store's own counters (`store.stats`, where the backend keeps them)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = getattr(self.store, "stats", None)
        if stats is None or not hasattr(stats, "as_dict"):
            return
        for name, value in stats.as_dict().items():
            yield CounterMetricFamily(f"vlcache_store_{name}", f"Store counter {name!r}",
                                      value=value)
