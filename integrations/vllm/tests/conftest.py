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
