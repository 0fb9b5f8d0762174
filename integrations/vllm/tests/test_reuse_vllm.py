"""End to end inside vLLM: a moved image served from vlcache's KV entry.

One vLLM process (vLLM's own interpreter, started from here) runs
`benchmarks/reuse_moved.py` at 256 image tokens: the image is saved by a first prompt; the same
prompt with every image token reused (static:0) gives vLLM's greedy tokens (rotation and paged
writes are right); the moved prompt (another system prompt, the question before the image)
with static:1.0 gives vLLM's greedy tokens; a batch mixing reuse and plain requests gives each
request's tokens alone.

Slow (one vLLM start-up, ~1 min eager here, plus ~2 min of prompts). Skipped, with the reason,
unless a vLLM 0.32 interpreter is found (see test_ec_vllm.find_vllm_python).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from test_ec_vllm import FIXTURE, REPO, find_vllm_python

SCRIPT = REPO / "integrations/vllm/benchmarks/reuse_moved.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    python, why = find_vllm_python()
    if python is None:
        pytest.skip(why)
    if not (FIXTURE / "config.json").exists():
        pytest.skip(f"the fixture checkpoint is not at {FIXTURE} (vlcache-fixture fetch)")
    out = tmp_path_factory.mktemp("reuse")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in
                                         ("src", "integrations/vllm/src", "benchmarks"))}
    cmd = [python, str(SCRIPT), "--model", str(FIXTURE), "--tokens", "256", "--rounds", "1",
           "--batch", "2", "--store", f"disk://{out / 'kv'}", "--json", str(out / "r.json")]
    with open(out / "vllm.log", "w") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    assert done.returncode == 0, (out / "vllm.log").read_text()[-4000:]
    return json.loads((out / "r.json").read_text())


def test_the_saved_prompt_with_all_image_kv_reused_is_vllms(report: dict) -> None:
    assert report["same_context_static0"]
    assert report["store"]["saves"] >= 1 and report["store"]["hits"] >= 2


def test_a_moved_image_at_static_1_is_vllms(report: dict) -> None:
    assert report["arms"]["static:1.0"]["same_tokens"]


def test_static_0_05_reuses_most_image_rows(report: dict) -> None:
    assert report["store"]["reused_rows"] > 0
    assert report["arms"]["static:0.05"]["tokens"]


def test_batched_requests_keep_their_answers(report: dict) -> None:
    assert all(report["batch"]["same"])
