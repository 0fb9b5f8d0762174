"""A text-only GGUF checkpoint (the fixture's Qwen2.5 language model) served by the engine.

Needs the ~490 MB GGUF that `vlcache-fixture build` downloads (fixture/README.md); skipped when
it is not there. `$VLCACHE_GGUF` names another copy of the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.conftest import document, user
from tests.engine.helpers import hf_logits
from vlcache.engine import Engine


def _fixture_gguf() -> Path:
    """Where the fixture's build leaves the GGUF: `$VLCACHE_CACHE_DIR` (default
    ~/.cache/vlcache) / gguf / qwen2.5-coder-0.5b-instruct.gguf."""
    if os.environ.get("VLCACHE_GGUF"):
        return Path(os.environ["VLCACHE_GGUF"]).expanduser()
    cache = os.environ.get("VLCACHE_CACHE_DIR")
    root = Path(cache).expanduser() if cache else Path.home() / ".cache" / "vlcache"
    return root / "gguf" / "qwen2.5-coder-0.5b-instruct.gguf"


GGUF = _fixture_gguf()

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} is not downloaded")]


def test_gguf_document_reuse_equals_full_forward():
    engine = Engine.from_pretrained(GGUF, policy="static:1.0")
    assert engine.adapter.architecture == "qwen2" and engine.adapter.num_layers == 24
    doc = "The river Omblen flows through Tarsk and ends in the Lake of Vire."
    engine.prefill([user(document(doc), "Summarize this document:")])
    messages = [{"role": "system", "content": "Answer in a few words."},
                user("Read this:", document(doc), "Where does the Omblen end?")]
    run = engine.prefill(messages, keep_hidden=True)
    assert run.stats.documents_reused == 1
    ref = hf_logits(engine, run.prompt)
    torch.testing.assert_close(engine.adapter.logits(run.output.final_hidden), ref,
                               atol=2e-3, rtol=0)
    answer = engine.generate(messages, policy="naive", max_tokens=12).text
    assert "Vire" in answer
