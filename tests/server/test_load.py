"""A bounded load test: 16 concurrent clients, 200 requests of repeated, new and bad images.

No 5xx other than 503 from the full queue, every success a valid answer, and /metrics counting
exactly what the clients saw.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL, ask, data_url, random_image

ROOT = Path(__file__).resolve().parents[2]
CLIENTS, REQUESTS = 16, 200
KINDS = {"repeat": 8, "new": 4, "text": 2, "bad-base64": 1, "bad-bytes": 1, "bad-part": 1}
EXPECTED = {"repeat": {200, 503}, "new": {200, 503}, "text": {200, 503}, "bad-base64": {400},
            "bad-bytes": {400, 503}, "bad-part": {422}}  # refused before or after queueing
TOTALS = {"vlcache_image_cache_hits_total": "images_hit",
          "vlcache_image_cache_misses_total": "images_missed",
          "vlcache_images_kv_reused_total": "images_kv_reused",
          "vlcache_cached_tokens_total": "cached",
          "vlcache_prompt_tokens_total": "prompt",
          "vlcache_completion_tokens_total": "completion"}


def _request(i: int, rng: random.Random) -> tuple[str, dict]:
    """Request `i` of the mix: a repeated image, a new one, text only, or a bad one."""
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    image = {"repeat": random_image(rng.randrange(4)), "new": random_image(1000 + i),
             "bad-base64": "data:image/png;base64,@@@",
             "bad-bytes": data_url(b"plain text, not a PNG")}.get(kind)
    messages = ask(image, f"Question {i}?", system=f"System prompt {rng.randrange(5)}.")
    if kind == "bad-part":
        messages[-1]["content"].insert(0, {"type": "video_url", "video_url": {"url": "x"}})
    return kind, {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0,
                  "stream": rng.random() < 0.3}


def _clients(base: str, tmp_path: Path) -> list[tuple[str, int, dict]]:
    rng = random.Random(0)
    todo = tmp_path / "requests.json"
    todo.write_text(json.dumps([_request(i, rng) for i in range(REQUESTS)]))
    done = subprocess.run([sys.executable, "-m", "tests.server.load_clients", base, str(todo),
                           str(CLIENTS)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [tuple(row) for row in json.loads(done.stdout)]


def _metrics(base: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_load(serve, tmp_path):
    base = serve(max_queue=12)
    seen = _clients(base, tmp_path)
    assert len(seen) == REQUESTS
    for kind, status, info in seen:
        assert status in EXPECTED[kind], (kind, status, info)
        assert status != 503 or int(info["retry_after"]) >= 1
    ok = [info for _, status, info in seen if status == 200]
    assert [info for info in ok if info["invalid"]] == []
    assert len(ok) > REQUESTS // 2 and any(info["cached"] > 0 for info in ok)

    m = _metrics(base)
    statuses = Counter(status for _, status, _ in seen)
    for status, n in statuses.items():
        assert m[("vlcache_requests_total", (("endpoint", "/v1/chat/completions"),
                                             ("status", str(status))))] == n, status
    errors = Counter((info["type"], info["code"]) for _, status, info in seen if status != 200)
    counted = {(labels[1][1], labels[0][1]): v for (name, labels), v in m.items()
               if name == "vlcache_errors_total"}
    assert counted == errors
    for metric, field in TOTALS.items():
        assert m[(metric, ())] == sum(info[field] for info in ok), metric
    assert m[("vlcache_ttft_seconds_count", ())] == len(ok)
    assert m[("vlcache_prepare_seconds_count", ())] == len(ok)
    assert 0 < m[("vlcache_prepare_seconds_sum", ())] < m[("vlcache_ttft_seconds_sum", ())]
    assert m[("vlcache_queue_depth", ())] == 0 and m[("vlcache_store_bytes", ())] > 0
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
