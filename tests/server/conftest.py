"""A real uvicorn server on a free loopback port, in a thread, and the `openai` client for it."""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest
import torch
from PIL import Image

from tests.conftest import random_image
from vlcache.engine import Engine, Limits
from vlcache.models.synthetic import TINY, save_checkpoint
from vlcache.server import ServerConfig, create_app
from vlcache.server.local import serve_in_thread

MODEL = "tiny"


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model is fastest on one thread, and the test machine is shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def checkpoint(tmp_path_factory) -> Path:
    return save_checkpoint(tmp_path_factory.mktemp("server-model"), TINY["qwen2_5_vl"], seed=0)


def live_server(engine, config: ServerConfig | None = None, app=None):
    """Runs `app` or `create_app(engine, config)` under uvicorn; yields its base URL."""
    return serve_in_thread(app or create_app(engine, config))


ServerFactory = Callable[..., str]


@pytest.fixture
def serve(request) -> Iterator[ServerFactory]:
    """serve(policy=..., limits=Limits(...), engine=..., **ServerConfig fields) -> base URL."""
    with ExitStack() as servers:
        def start(policy: str = "static:0.05", limits: Limits | None = None, engine=None,
                  **fields) -> str:
            if engine is None:  # the checkpoint is built only for tests that use the model
                engine = Engine.from_pretrained(request.getfixturevalue("checkpoint"),
                                                policy=policy, limits=limits)
            return servers.enter_context(live_server(engine, ServerConfig(MODEL, **fields)))
        yield start


def client(base_url: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1",
                         **{"api_key": "unused", "max_retries": 0, "timeout": 30.0, **kwargs})


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def data_url(image: Image.Image | bytes, mime: str = "image/png") -> str:
    raw = image if isinstance(image, bytes) else png_bytes(image)
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def ask(image: Image.Image | bytes | str | None, question: str,
        system: str | None = None) -> list[dict]:
    """Chat messages: an optional system prompt, then the image (data URL or a URL) and text."""
    content: list[dict] = []
    if image is not None:
        url = image if isinstance(image, str) else data_url(image)
        content.append({"type": "image_url", "image_url": {"url": url}})
    content.append({"type": "text", "text": question})
    messages: list[dict] = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": content}]


__all__ = ["MODEL", "ask", "client", "data_url", "live_server", "png_bytes", "random_image"]
