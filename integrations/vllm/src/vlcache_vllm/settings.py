"""The connector's settings: vLLM's `ec_connector_extra_config` dict, checked once at start-up
(an error here stops vLLM before it serves, with the reason; nothing later raises)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vlcache_vllm.cache import check_shared


@dataclass(frozen=True)
class Settings:
    """`store`: a vlcache store address every vLLM process of the deployment can reach
    (`disk:///path`, `redis://host/0`, tiers joined by `+`); `model_fingerprint`: use this
    string instead of hashing the checkpoint (a large model hashes for seconds per process)."""

    store: str
    model_fingerprint: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.store, str) or not self.store:
            raise ValueError("ec_connector_extra_config needs \"store\": a vlcache store address, "
                             "e.g. \"disk:///var/cache/vlcache-ec\"")
        check_shared(self.store)
        if self.model_fingerprint is not None and not isinstance(self.model_fingerprint, str):
            raise ValueError("\"model_fingerprint\" must be a string")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> Settings:
        extra = dict(extra or {})
        unknown = sorted(set(extra) - {"store", "model_fingerprint"})
        if unknown:
            raise ValueError(f"unknown ec_connector_extra_config keys {unknown}: expected "
                             "\"store\" and optionally \"model_fingerprint\"")
        return cls(store=extra.get("store", ""), model_fingerprint=extra.get("model_fingerprint"))
