"""The bounded queue in front of the one model worker: 503 when full, slots freed by clients
that leave, and the per-request timeout. A slow stand-in engine makes the timing predictable."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server.conftest import MODEL, ask, client
from vlcache.engine import GenerationResult, Limits, RequestStats, StreamDelta
from vlcache.server.worker import Job, ModelWorker
from vlcache.stores import open_store

STEP_S = 0.05
TIMEOUT_S = 0.5


class SlowEngine:
    """Answers "x" per token, one every STEP_S seconds; counts the tokens it produced."""

    def __init__(self) -> None:
        self.store = open_store(None)
        self.limits = Limits()
        self.produced = 0

    def stream(self, messages, max_tokens: int, **_) -> Iterator[StreamDelta]:
        for _ in range(max_tokens):
            time.sleep(STEP_S)
            self.produced += 1
            yield StreamDelta("x")
        stats = RequestStats(policy="slow", prompt_tokens=1, completion_tokens=max_tokens)
        yield StreamDelta("", GenerationResult("x" * max_tokens, [0] * max_tokens, "length",
                                               stats))


def _health(base: str) -> dict:
    return httpx.get(f"{base}/health").json()


def _wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _background(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - reported to the test through `out`
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def slow(serve):
    engine = SlowEngine()
    return engine, serve(engine=engine, max_queue=1, request_timeout_s=30.0)


def _long_stream(base: str):
    stream = client(base).chat.completions.create(model=MODEL, messages=ask(None, "go"),
                                                  max_tokens=400, stream=True)
    next(iter(stream))
    return stream


def test_full_queue_is_503_with_retry_after_and_leaving_frees_the_worker(slow):
    engine, base = slow
    running = _long_stream(base)
    _wait_for(lambda: _health(base)["busy"])
    waiting, result = _background(lambda: client(base).chat.completions.create(
        model=MODEL, messages=ask(None, "next"), max_tokens=2))
    _wait_for(lambda: _health(base)["queue_depth"] == 1)
    with pytest.raises(openai.APIStatusError) as info:
        client(base).chat.completions.create(model=MODEL, messages=ask(None, "one too many"),
                                             max_tokens=2)
    assert info.value.status_code == 503
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert info.value.response.json()["error"]["code"] == "queue_full"
    running.close()  # the client leaves mid-stream: the worker moves on to the waiting one
    waiting.join(5)
    assert result["value"].choices[0].message.content == "xx"
    assert engine.produced < 100
    assert _health(base) == {"status": "ok", "model": MODEL, "queue_depth": 0, "busy": False}


def test_a_client_leaving_the_queue_frees_its_slot(slow):
    _, base = slow
    running = _long_stream(base)
    impatient = client(base, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=MODEL, messages=ask(None, "wait"), max_tokens=2)
    _wait_for(lambda: _health(base)["queue_depth"] == 0, timeout=2)
    waiting, result = _background(lambda: client(base).chat.completions.create(
        model=MODEL, messages=ask(None, "my turn"), max_tokens=2))
    _wait_for(lambda: _health(base)["queue_depth"] == 1)  # accepted, not 503
    running.close()
    waiting.join(5)
    assert result["value"].choices[0].message.content == "xx"


def test_request_timeout(serve):
    engine = SlowEngine()
    base = serve(engine=engine, request_timeout_s=TIMEOUT_S)
    c = client(base)
    with pytest.raises(openai.APIStatusError) as info:
        c.chat.completions.create(model=MODEL, messages=ask(None, "slow"), max_tokens=200)
    assert info.value.status_code == 504
    assert info.value.response.json()["error"]["code"] == "timeout"
    with pytest.raises(openai.APIError, match="did not finish"):
        for _ in c.chat.completions.create(model=MODEL, messages=ask(None, "slow"),
                                           max_tokens=200, stream=True):
            pass
    _wait_for(lambda: not _health(base)["busy"], timeout=1)
    assert engine.produced < 2 * TIMEOUT_S / STEP_S + 10  # both stopped at their deadline
    ok = c.chat.completions.create(model=MODEL, messages=ask(None, "quick"), max_tokens=3)
    assert ok.choices[0].message.content == "xxx"


def test_stopping_the_worker_answers_the_waiting_jobs():
    async def scenario() -> list:
        worker = ModelWorker(SlowEngine(), max_queue=4)
        worker.start()
        loop = asyncio.get_running_loop()
        jobs = [Job([], {"max_tokens": 100}, loop, deadline=time.monotonic() + 30)
                for _ in range(3)]
        for job in jobs:
            worker.submit(job)
        _, first = await jobs[0].events.get()  # the first one is running
        await asyncio.to_thread(worker.stop)
        assert not worker.alive
        return [first] + [(await job.events.get())[1] for job in jobs[1:]]

    first, *waiting = asyncio.run(scenario())
    assert first == "x"
    assert [(e.status, e.code) for e in waiting] == [(503, "shutting_down")] * 2
