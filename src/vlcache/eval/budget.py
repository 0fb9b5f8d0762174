"""Equal compute: each policy family's parameters for a target budget B.

B is the mean over layers of the share of a reused image's tokens that are computed (the same
quantity as a plan's budget), so policies compare at the same number of computed token-layers:
- static: r = B at every layer;
- epic: K = round(B · mean N) leading tokens, mean N over the evaluated examples' segments (a
  fixed count: the share varies by image, but the token-weighted share over the set is B;
  `vlcache eval` sizes K per half, since the halves' images differ in size);
- cacheblend: all tokens up to the check layer c, then ratio (B·L - c)/(L - c);
  impossible below B = c/L (returns None);
- cacheblend-check: the same with the check layer chosen per budget on the planning half
  (eval/check_layer.py: the feasible c with the smallest first-token KL against full);
- kvshare: all up to layer1, 2ρ up to layer2, then ρ; ρ solved from the same mean;
- vlcache / vlcache-greedy: the plan allocated for B from the profiled sensitivity table;
- vlcache-depth: the plan allocated for B from the depth profile (planner/depth.py);
- vlcache-query: the plan allocated for B from a profile measured with the query rule (the
  generalised plan: the DP's counts filled by the question's attention);
- query, oracle: r = B at every layer, tokens ranked by the question's attention (a relevance
  pass, timed as select_s) or, analysis only, by their true KV error against the full run;
- guard: its base policy query:B (default threshold); it recomputes everything when its signal
  fires, so its measured share (base pass included) is above B by the escalations.
The engine's rounding up (ceil(r·N)) makes the measured share slightly higher; the report shows
the measured share next to the target.
"""

from __future__ import annotations

from vlcache.eval.check_layer import CheckLayer
from vlcache.planner.depth import DepthProfile, depth_plan
from vlcache.planner.profile import Profile, make_plan
from vlcache.reuse.blend import CacheBlendPolicy, KVSharePolicy
from vlcache.reuse.epic import EpicPolicy
from vlcache.reuse.guard import GuardPolicy
from vlcache.reuse.policy import Policy, RatioPolicy, UniformPolicy
from vlcache.reuse.ranking import RankedPolicy

FAMILIES = ("static", "epic", "cacheblend", "cacheblend-check", "kvshare", "vlcache",
            "vlcache-greedy", "vlcache-depth", "vlcache-query", "query", "oracle", "guard")


def policy_at(family: str, budget: float, num_layers: int, mean_tokens: float,
              profile: Profile | None = None,
              depth_profile: DepthProfile | None = None,
              query_profile: Profile | None = None,
              check_layers: dict[float, CheckLayer] | None = None) -> Policy | None:
    """The policy of `family` that spends `budget`, or None where the family cannot."""
    if family == "static":
        return UniformPolicy(budget)
    if family in {"query", "oracle"}:
        return RankedPolicy(budget, rule=family)
    if family == "guard":
        return GuardPolicy(ratio=budget)
    if family == "epic":
        return EpicPolicy(max(1, round(budget * mean_tokens)))
    if family == "cacheblend":
        c = 1
        ratio = (budget * num_layers - c) / (num_layers - c)
        return CacheBlendPolicy(ratio, c) if ratio >= 0 else None
    if family == "cacheblend-check":
        if check_layers is None:
            raise ValueError("cacheblend-check needs check layers chosen on the planning half")
        choice = check_layers.get(budget)
        return None if choice is None else choice.policy(num_layers)
    if family == "kvshare":
        first, second = KVSharePolicy(0.0).layers(num_layers)
        ratio = (budget * num_layers - first) / (2 * (second - first) + num_layers - second)
        return KVSharePolicy(min(ratio, 0.5), first, second) if ratio >= 0 else None
    if family in {"vlcache", "vlcache-greedy"}:
        if profile is None:
            raise ValueError(f"{family} needs a sensitivity profile")
        plan = make_plan(profile, budget, "dp" if family == "vlcache" else "greedy")
        return RatioPolicy(plan, name=f"{family}@{budget:g}")
    if family == "vlcache-query":
        if query_profile is None or query_profile.rule != "query":
            raise ValueError(f"{family} needs a sensitivity profile measured with the query rule")
        return RankedPolicy(make_plan(query_profile, budget), name=f"{family}@{budget:g}")
    if family == "vlcache-depth":
        if depth_profile is None:
            raise ValueError("vlcache-depth needs a depth profile")
        return RatioPolicy(depth_plan(depth_profile, budget, num_layers),
                           name=f"{family}@{budget:g}")
    raise ValueError(f"unknown policy family {family!r}: expected one of {', '.join(FAMILIES)}")
