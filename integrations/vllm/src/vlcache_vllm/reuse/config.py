"""vlcache's reuse settings in vLLM: `additional_config={"vlcache": {...}}`, checked when the
worker starts (an error stops vLLM with the reason)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vlcache.reuse.registry import parse_policy
from vlcache_vllm.settings import check_store_and_fingerprint, section_keys

KEYS = {"store", "policy", "model_fingerprint"}


@dataclass(frozen=True)
class ReuseConfig:
    """`store`: a vlcache store every vLLM process shares (`disk:///path`, `redis://...`);
    `policy`: the default for requests that ask for reuse without naming one (`static:0.05`);
    `model_fingerprint`: a string naming the model instead of hashing the checkpoint."""

    store: str
    policy: str = "static:0.05"
    model_fingerprint: str | None = None

    def __post_init__(self) -> None:
        check_store_and_fingerprint(self.store, self.model_fingerprint,
                                    'additional_config["vlcache"]', "disk:///var/cache/vlcache")
        parse_policy(self.policy)  # a bad name stops start-up, not a request

    @classmethod
    def from_additional(cls, additional: Mapping[str, Any] | None) -> ReuseConfig:
        section = section_keys((additional or {}).get("vlcache"), KEYS,
                               'additional_config["vlcache"]')
        return cls(**{"store": "", **section})
