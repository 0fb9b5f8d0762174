"""`vlcache serve`: the OpenAI-compatible HTTP server over one engine."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from vlcache.commands.device import add_device_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    from vlcache.engine.request import Limits
    from vlcache.server.config import ServerConfig

    d, lim = ServerConfig(model_name="-"), Limits()
    p.add_argument("--model", required=True, help="local checkpoint directory")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the directory's name)")
    p.add_argument("--store", default=None, help="store address (default memory://)")
    p.add_argument("--policy", "--plan", dest="policy", default=None,
                   help="full | encoder | naive | static:R | plan:FILE.json")
    add_device_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--allowed-local-media-path", type=Path, default=None,
                   help="serve image paths and file:// URLs under this directory only")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="let requests name http(s) image URLs for the server to download")
    p.add_argument("--remote-media-timeout", type=float, default=d.remote_media_timeout_s,
                   help="seconds (default %(default)s)")
    p.add_argument("--max-media-bytes", type=int, default=d.max_media_bytes,
                   help="one local or downloaded image file (default %(default)s)")
    p.add_argument("--max-queue", type=int, default=d.max_queue,
                   help="requests waiting for the model; beyond, 503 (default %(default)s)")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                   help="seconds from arrival to the last token (default %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--max-images", type=int, default=lim.max_images)
    p.add_argument("--max-image-pixels", type=int, default=lim.max_image_pixels)
    p.add_argument("--max-prompt-tokens", type=int, default=lim.max_prompt_tokens)
    p.add_argument("--max-prompt-chars", type=int, default=None,
                   help="characters of a request's text, refused before tokenizing "
                        "(default: 8 per --max-prompt-tokens)")
    p.add_argument("--max-total-image-pixels", type=int, default=lim.max_total_image_pixels,
                   help="decoded pixels of all a request's images (default %(default)s)")
    p.add_argument("--max-total-image-tokens", type=int, default=lim.max_total_image_tokens,
                   help="image tokens of all a request's images (default %(default)s)")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens_limit,
                   help="largest max_tokens a request may ask for (default %(default)s)")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument("--api-key", default=os.environ.get("VLCACHE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: "
                        "$VLCACHE_API_KEY; unset: no key)")
    p.add_argument("--allowed-origins", type=_names, default=(),
                   help='CORS origins, e.g. \'["https://app.example"]\' or a,b (default: none, '
                        "no CORS headers)")
    p.add_argument("--allowed-methods", type=_names, default=d.allowed_methods)
    p.add_argument("--allowed-headers", type=_names, default=d.allowed_headers)
    p.add_argument("--allow-credentials", action="store_true")
    p.add_argument("--store-recount-interval", type=float, default=d.store_recount_s,
                   help="seconds between background recounts of the store's bytes and entries "
                        "(default %(default)s)")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from vlcache.server import create_app
    except ImportError as e:
        print(f"vlcache serve: {e.name} is missing; install the server extra: "
              "pip install 'vlcache[server]'", file=sys.stderr)
        return 2
    import torch

    from vlcache.commands.device import device_and_dtype
    from vlcache.engine import Engine, Limits
    from vlcache.engine.engine import DEFAULT_POLICY
    from vlcache.models.loading import ModelLoadError
    from vlcache.server import ServerConfig

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        config = ServerConfig(
            model_name=args.served_model_name or Path(args.model).resolve().name,
            max_queue=args.max_queue, request_timeout_s=args.request_timeout,
            max_body_bytes=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
            max_tokens_limit=args.max_tokens_limit,
            allowed_local_media_path=args.allowed_local_media_path,
            allow_remote_media=args.allow_remote_media,
            remote_media_timeout_s=args.remote_media_timeout, max_media_bytes=args.max_media_bytes,
            api_key=args.api_key or None, allowed_origins=args.allowed_origins,
            allowed_methods=args.allowed_methods, allowed_headers=args.allowed_headers,
            allow_credentials=args.allow_credentials,
            store_recount_s=args.store_recount_interval)
        limits = Limits(max_images=args.max_images, max_image_pixels=args.max_image_pixels,
                        max_total_image_pixels=args.max_total_image_pixels,
                        max_total_image_tokens=args.max_total_image_tokens,
                        max_prompt_tokens=args.max_prompt_tokens,
                        max_prompt_chars=args.max_prompt_chars)
        device, dtype = device_and_dtype(args)
        engine = Engine.from_pretrained(args.model, store=args.store,
                                        policy=args.policy or DEFAULT_POLICY,
                                        dtype=dtype, device=device, limits=limits,
                                        packing=args.packing)
    except (ModelLoadError, ValueError) as e:
        print(f"vlcache serve: {e}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(engine, config), host=args.host, port=args.port,
                log_level=args.log_level)
    return 0


def _names(text: str) -> tuple[str, ...]:
    """A JSON list of strings (as vLLM's flags take) or a comma-separated list."""
    if text.lstrip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"not a JSON list: {e}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError("expected a JSON list of strings")
        return tuple(value)
    return tuple(v.strip() for v in text.split(",") if v.strip())
