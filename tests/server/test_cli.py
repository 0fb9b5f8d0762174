"""`vlcache serve` from its command line to a running app, called by the example script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import uvicorn

from tests.server.conftest import live_server
from vlcache import cli

ROOT = Path(__file__).resolve().parents[2]


def test_serve_command_and_the_example_client(checkpoint, monkeypatch):
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    assert cli.main(["serve", "--model", str(checkpoint), "--served-model-name", "vl",
                     "--port", "8123", "--max-queue", "3", "--max-image-pixels", "500000",
                     "--request-timeout", "20", "--log-level", "warning"]) == 0
    app = started["app"]
    assert (started["host"], started["port"]) == ("127.0.0.1", 8123)
    assert (app.state.config.model_name, app.state.config.max_queue) == ("vl", 3)
    assert app.state.config.request_timeout_s == 20
    assert app.state.engine.limits.max_image_pixels == 500_000
    with live_server(None, app=app) as base:
        smoke = subprocess.run([sys.executable, "examples/openai_client.py", "--base-url",
                                f"{base}/v1", "--max-tokens", "4"], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
    assert smoke.returncode == 0, smoke.stderr
    lines = smoke.stdout.splitlines()
    assert lines[0].startswith("[1] Q:") and "cached_tokens=0 " in lines[2]
    assert "cached_tokens=0 " not in lines[5] and "'images_hit': 1" in lines[5]
    assert lines[6].startswith("[3] streamed:")


def test_serve_refuses_a_missing_model(tmp_path, capsys):
    assert cli.main(["serve", "--model", str(tmp_path / "none")]) == 2
    assert "vlcache serve:" in capsys.readouterr().err
