"""Server settings: one frozen value built by `vlcache serve` (or a test) and checked once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MiB = 2**20


@dataclass(frozen=True)
class ServerConfig:
    """Everything the HTTP layer decides; model-side limits live in `vlcache.engine.Limits`."""

    model_name: str
    max_queue: int = 64  # requests waiting for the model worker (the running one not counted)
    request_timeout_s: float = 300.0  # from arrival to the last token, queue wait included
    max_body_bytes: int = 32 * MiB
    default_max_tokens: int = 256
    max_tokens_limit: int = 4096
    allowed_local_media_path: Path | None = None
    allow_remote_media: bool = False
    remote_media_timeout_s: float = 10.0
    max_media_bytes: int = 20 * MiB  # one local or remote image file
    api_key: str | None = field(default=None, repr=False)  # /v1/* need "Bearer <key>"
    allowed_origins: tuple[str, ...] = ()  # CORS; empty: no CORS headers at all
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    store_recount_s: float = 30.0  # how often the store's bytes and entries are recounted

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_body_bytes", "default_max_tokens", "max_tokens_limit",
                     "max_media_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be empty")
        for name in ("request_timeout_s", "remote_media_timeout_s", "store_recount_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(f"default_max_tokens ({self.default_max_tokens}) exceeds "
                             f"max_tokens_limit ({self.max_tokens_limit})")
        if self.allowed_local_media_path is not None:
            root = Path(self.allowed_local_media_path).resolve()
            if not root.is_dir():
                raise ValueError(f"allowed_local_media_path {root} is not a directory")
            object.__setattr__(self, "allowed_local_media_path", root)
