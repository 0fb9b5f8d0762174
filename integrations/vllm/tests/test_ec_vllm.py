"""End to end with vLLM: two vLLM processes (vLLM's own interpreter, started from here) share a
disk store through the connector; the second answers an image the first saw without running
its vision tower, with the same greedy tokens; a damaged entry is a miss with the same answer.

Slow (two vLLM start-ups, minutes each on a CPU). Skipped unless a vLLM 0.32 interpreter is
found: $VLCACHE_VLLM_PYTHON, or .venv-vllm/bin/python at the repository root
(integrations/vllm/setup.sh makes it), or this interpreter if it has vLLM.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from peer.protocol import Worker

REPO = Path(__file__).resolve().parents[3]
WORKER = REPO / "integrations/vllm/benchmarks/ec_worker.py"
FIXTURE = Path.home() / ".cache/vlcache/fixture-qwen2_5_vl-0.5b"
ASK = {"op": "generate", "tokens": 256, "seed": 3, "max_tokens": 8}

pytestmark = pytest.mark.slow


def find_vllm_python() -> tuple[str | None, str]:
    """(interpreter, why not) for a Python that can import vLLM."""
    candidates = [os.environ.get("VLCACHE_VLLM_PYTHON"), str(REPO / ".venv-vllm/bin/python")]
    if importlib.util.find_spec("vllm") is not None:
        candidates.append(sys.executable)
    for python in filter(None, candidates):
        if Path(python).exists() and subprocess.run(
            [python, "-c", "import importlib.util as u, sys; "
                           "sys.exit(u.find_spec('vllm') is None)"]).returncode == 0:
            return python, ""
    return None, ("vLLM is not importable: set VLCACHE_VLLM_PYTHON to a vLLM 0.32 interpreter "
                  "(integrations/vllm/setup.sh makes .venv-vllm)")


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python, why = find_vllm_python()
    if python is None:
        pytest.skip(why)
    if not (FIXTURE / "config.json").exists():
        pytest.skip(f"the fixture checkpoint is not at {FIXTURE} (vlcache-fixture fetch)")
    return python


@pytest.fixture
def start(vllm_python: str, tmp_path: Path) -> Iterator:
    sys.path.insert(0, str(REPO / "benchmarks"))  # the `peer` package: its worker protocol
    from peer.protocol import Worker

    workers: list[Worker] = []
    log = open(tmp_path / "vllm.log", "a")  # noqa: SIM115 - closed below

    def start(store: str) -> Worker:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in
                                             ("src", "integrations/vllm/src", "benchmarks"))}
        worker = Worker("vllm", [vllm_python, str(WORKER), "--model", str(FIXTURE),
                                 "--store", store], env, log)
        workers.append(worker)
        worker.wait_ready(timeout=1200)
        return worker

    yield start
    for w in workers:
        w.close()
    log.close()


def ask(worker: Worker, request: dict) -> dict:
    answer = worker.call(request, timeout=900)
    assert answer["ok"], answer
    return answer


def flip_every_entry(root: Path) -> int:
    files = sorted(root.glob("*.vlc"))
    for f in files:
        blob = bytearray(f.read_bytes())
        blob[len(blob) // 2] ^= 0x01
        f.write_bytes(bytes(blob))
    return len(files)


def test_a_second_process_skips_the_vision_tower(start, tmp_path: Path) -> None:
    root = tmp_path / "ec"
    store = f"disk://{root}"

    first = start(store)
    a = ask(first, ASK)
    first.close()
    assert a["vision_calls"] >= 1
    assert a["counters"]["worker"]["saves"] == 1
    assert a["counters"]["scheduler"]["misses"] == 1
    assert len(list(root.glob("*.vlc"))) == 1

    second = start(store)
    b = ask(second, ASK)
    assert b["vision_calls"] == 0  # the encoder output came from the store
    assert b["counters"]["scheduler"]["hits"] == 1
    assert b["counters"]["worker"]["placed"] == 1 and b["counters"]["worker"]["saves"] == 0
    assert b["token_ids"] == a["token_ids"] and b["text"] == a["text"]

    assert flip_every_entry(root) == 1
    ask(second, {"op": "reset"})  # vLLM's own encoder cache, so it asks the connector again
    c = ask(second, ASK)
    assert c["vision_calls"] >= 1
    scheduler = c["counters"]["scheduler"]
    assert scheduler["damaged"] == 1 and scheduler["misses"] == 1 and scheduler["hits"] == 1
    assert c["counters"]["worker"]["saves"] == 1  # computed again and stored afresh
    assert c["token_ids"] == a["token_ids"]
