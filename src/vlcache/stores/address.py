"""Store addresses: `memory://?max_bytes=2GB`, `disk:///path`, `redis://host/0`, tiers joined by
`+` (fastest first), and the option parsers the backends share. See docs/stores.md."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from vlcache.stores.base import Store
from vlcache.stores.tiered import TieredStore

if TYPE_CHECKING:
    from vlcache.keys import ModelFingerprint


# scheme -> "module:factory"; a factory takes the address string and a keyword `model` (the
# model fingerprint as a string, or None) and returns a Store.
SCHEMES: dict[str, str] = {
    "memory": "vlcache.stores.memory:from_address",
    "disk": "vlcache.stores.disk:from_address",
    "redis": "vlcache.stores.redis:from_address",
    "rediss": "vlcache.stores.redis:from_address",
}


def split_tiers(address: str) -> list[str]:
    """'memory://?max_bytes=2GB+disk:///var/cache' -> its tiers, fastest first.

    Only a `+` directly followed by a registered scheme and `://` separates tiers, so a `+` inside
    a path or a password stays where it is.
    """
    schemes = "|".join(re.escape(s) for s in sorted(SCHEMES, key=len, reverse=True))
    return re.split(rf"\+(?=(?:{schemes})://)", address)


def open_store(
    address: str | Store | None = None, *, model: ModelFingerprint | str | None = None
) -> Store:
    """Open a store from an address such as `memory://?max_bytes=2GB` (None = the default).

    `model` is the fingerprint of the model whose entries the store holds; stores that keep
    entries outside this process write it into each entry's header and reject entries whose
    header names another model. Tiers are joined with `+`, fastest first (see docs/stores.md).
    """
    if isinstance(address, Store):
        return address
    address = address or "memory://"
    fingerprint = None if model is None else str(model)
    tiers = split_tiers(address)
    if len(tiers) > 1:
        return TieredStore([open_store(t, model=fingerprint) for t in tiers])
    scheme = urlsplit(address).scheme
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise ValueError(f"unknown store address {address!r}: expected one of {known}")
    module, _, func = SCHEMES[scheme].partition(":")
    return getattr(importlib.import_module(module), func)(address, model=fingerprint)


def parse_options(address: str, allowed: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """The query options of an address, each converted; unknown or repeated ones are errors."""
    options: dict[str, Any] = {}
    for name, value in parse_qsl(urlsplit(address).query, keep_blank_values=True):
        if name not in allowed:
            raise ValueError(
                f"unknown store option {name!r} in {address!r}: expected {sorted(allowed)}"
            )
        if name in options:
            raise ValueError(f"store option {name!r} given twice in {address!r}")
        try:
            options[name] = allowed[name](value)
        except ValueError as e:
            raise ValueError(f"store option {name}={value!r} in {address!r}: {e}") from None
    return options


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10,
          "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """'512MB', '2GiB', '1000' -> bytes."""
    t = text.strip().upper().replace("_", "")
    digits = t.rstrip("KMGTIB")
    unit = t[len(digits):]
    if unit not in _UNITS or not digits:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 512MB, 2GiB)")
    return int(float(digits) * _UNITS[unit])


_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d' -> seconds."""
    t = text.strip().lower()
    digits = t.rstrip("smhd")
    unit = t[len(digits):]
    if unit not in _SECONDS or not digits:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 7d)")
    return float(digits) * _SECONDS[unit]


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in {"1", "true", "yes", "on"}:
        return True
    if t in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")
