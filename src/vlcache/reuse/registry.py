"""Policy names -> policies: the one place that knows every policy (`--policy`, `policy=`)."""

from __future__ import annotations

from vlcache.plan import Plan
from vlcache.reuse.blend import CacheBlendPolicy, KVSharePolicy
from vlcache.reuse.epic import EpicPolicy
from vlcache.reuse.guard import DEFAULT_RATIO, DEFAULT_THRESHOLD, GuardPolicy
from vlcache.reuse.policy import EncoderPolicy, FullPolicy, Policy, RatioPolicy, UniformPolicy
from vlcache.reuse.prefix import PrefixPolicy
from vlcache.reuse.ranking import RankedPolicy


def _parse_ratio(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"policy {spec!r}: {text!r} is not a number") from None


def _parse_int(spec: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"policy {spec!r}: {text!r} is not an integer") from None


POLICY_NAMES = ("full | encoder | prefix | naive | static:R | epic:K | "
                "cacheblend[:RATIO[:LAYER]] | kvshare[:RATIO[:LAYER1[:LAYER2]]] | "
                "query:R[:DEPTH] | oracle:R | guard[:THRESHOLD[:R]] | "
                "vlcache:PLAN.json (or plan:PLAN.json)")


def _parse_blend(spec: str, name: str, args: list[str]) -> Policy:
    if name == "cacheblend" and len(args) <= 2:
        ratio = _parse_ratio(spec, args[0]) if args else 0.15
        return CacheBlendPolicy(ratio, _parse_int(spec, args[1]) if len(args) > 1 else 1)
    if name == "kvshare" and len(args) <= 3:
        ratio = _parse_ratio(spec, args[0]) if args else 0.15
        layer1 = _parse_int(spec, args[1]) if len(args) > 1 else 1
        layer2 = _parse_int(spec, args[2]) if len(args) > 2 else None
        return KVSharePolicy(ratio, layer1, layer2)
    raise ValueError(f"policy {spec!r}: too many arguments")


def _plan_policy(plan: Plan, name: str | None = None) -> Policy:
    if plan.rule == "first":
        return RatioPolicy(plan, name=name)
    return RankedPolicy(plan, name=name)


def parse_policy(spec: str | Policy | Plan) -> Policy:
    """A policy from its name (see POLICY_NAMES), or a Policy/Plan value."""
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, Plan):
        return _plan_policy(spec)
    name, _, arg = spec.strip().partition(":")
    if name == "full" and not arg:
        return FullPolicy()
    if name == "encoder" and not arg:
        return EncoderPolicy()
    if name == "prefix" and not arg:
        return PrefixPolicy()
    if name == "naive" and not arg:
        return UniformPolicy(0.0, name="naive")
    if name == "static" and arg:
        return UniformPolicy(_parse_ratio(spec, arg))
    if name == "epic" and arg:
        return EpicPolicy(_parse_int(spec, arg))
    if name in {"cacheblend", "kvshare"}:
        return _parse_blend(spec, name, arg.split(":") if arg else [])
    if name in {"plan", "vlcache"} and arg:
        return _plan_policy(Plan.load(arg), name=f"{name}:{arg}")
    if name == "guard":
        args = arg.split(":") if arg else []
        if len(args) > 2:
            raise ValueError(f"policy {spec!r}: too many arguments")
        return GuardPolicy(_parse_ratio(spec, args[0]) if args else DEFAULT_THRESHOLD,
                           _parse_ratio(spec, args[1]) if len(args) > 1 else DEFAULT_RATIO)
    if name in {"query", "oracle"} and arg:
        ratio, _, depth = arg.partition(":")
        if depth and name != "query":
            raise ValueError(f"policy {spec!r}: too many arguments")
        return RankedPolicy(_parse_ratio(spec, ratio), rule=name,
                            depth=_parse_int(spec, depth) if depth else None)
    raise ValueError(f"unknown policy {spec!r}: expected {POLICY_NAMES}")
