"""Fixtures for the integration's tests: encoder outputs, and the repository's real
redis-server fixture (tests/stores/conftest.py) reused, not rewritten."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:  # `tests` is a package at the repository root
    sys.path.insert(0, str(REPO))

from tests.stores.conftest import redis_server, redis_url  # noqa: E402, F401 (fixtures)


@pytest.fixture
def output() -> torch.Tensor:
    """An encoder output as vLLM hands it over: [N, W]."""
    return torch.randn(64, 96)


@pytest.fixture
def disk_address(tmp_path: Path) -> str:
    return f"disk://{tmp_path / 'ec'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The end-to-end tests start vLLM (minutes each on a CPU): they run only when asked for
    with `-m slow`, even where a vLLM environment exists, so the plain test command stays
    fast."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="starts vLLM (minutes): run with -m slow")
    for item in items:
        if "slow" in item.keywords and "integrations/vllm" in str(item.fspath):
            item.add_marker(skip)
