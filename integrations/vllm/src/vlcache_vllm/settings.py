"""The connector's settings: vLLM's `ec_connector_extra_config` dict, checked once at start-up
(an error here stops vLLM before it serves, with the reason; nothing later raises)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vlcache_vllm.cache import check_shared


def section_keys(section: Mapping[str, Any] | None, keys: set[str], where: str) -> dict:
    """`section` as a dict, refusing keys other than `keys` (`where` names it in the error)."""
    section = dict(section or {})
    unknown = sorted(set(section) - keys)
    if unknown:
        raise ValueError(f"unknown {where} keys {unknown}: expected {sorted(keys)}")
    return section


def check_store_and_fingerprint(store: object, fingerprint: object, where: str,
                                example: str) -> None:
    """A shared vlcache store address (not `memory://`) and, if given, a string fingerprint."""
    if not isinstance(store, str) or not store:
        raise ValueError(f'{where} needs "store": a vlcache store address, e.g. "{example}"')
    check_shared(store)
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise ValueError('"model_fingerprint" must be a string')


@dataclass(frozen=True)
class Settings:
    """`store`: a vlcache store address every vLLM process of the deployment can reach
    (`disk:///path`, `redis://host/0`, tiers joined by `+`); `model_fingerprint`: use this
    string instead of hashing the checkpoint (a large model hashes for seconds per process)."""

    store: str
    model_fingerprint: str | None = None

    def __post_init__(self) -> None:
        check_store_and_fingerprint(self.store, self.model_fingerprint,
                                    "ec_connector_extra_config", "disk:///var/cache/vlcache-ec")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> Settings:
        extra = section_keys(extra, {"store", "model_fingerprint"}, "ec_connector_extra_config")
        return cls(store=extra.get("store", ""), model_fingerprint=extra.get("model_fingerprint"))
