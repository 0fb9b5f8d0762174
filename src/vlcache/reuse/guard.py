"""The quality guard: recompute everything when a cheap per-request signal says the answer may
change.

The guard runs a query-ranked policy (its relevance pass is a `naive` prefill of the prompt's
text, which also gives naive's first-token distribution), then compares that distribution with
the one after recomputing the chosen tokens. If recomputing a few percent of the reused tokens
moved the distribution by a large share of its top-1 margin, the tokens left stale could move it
further, past the margin: the request is recomputed in full (the vision tower stays skipped).

    signal = TV(p_policy, p_naive) / (p_policy[top-1] - p_policy[top-2])

`threshold` is the one number a user sets: lower recomputes more often and agrees more.
"""

from __future__ import annotations

import torch

from vlcache.reuse.policy import Policy, TokenSchedule
from vlcache.reuse.ranking import RankedPolicy

DEFAULT_THRESHOLD = 0.3  # 29 of 30 reading prompts kept with 10 escalated (docs/quality.md)
DEFAULT_RATIO = 0.1


def guard_signal(policy_logits: torch.Tensor, naive_logits: torch.Tensor) -> float:
    """TV distance of the two next-token distributions over the policy's top-1 margin."""
    p = torch.softmax(policy_logits.double(), dim=-1)
    q = torch.softmax(naive_logits.double(), dim=-1)
    shift = 0.5 * float((p - q).abs().sum())
    top = p.topk(2).values
    margin = float(top[0] - top[1])
    return shift / max(margin, 1e-9)


class GuardPolicy(Policy):
    """`base` (query-ranked, relevance pass over every layer), escalated to a full recompute
    when `guard_signal` exceeds `threshold`."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, ratio: float = DEFAULT_RATIO,
                 name: str | None = None) -> None:
        if not threshold >= 0.0:
            raise ValueError(f"guard threshold must be >= 0, got {threshold}")
        self.threshold = threshold
        self.base = RankedPolicy(ratio, rule="query")
        self.name = name or f"guard:{threshold:g}:{ratio:g}"

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        return self.base.schedule(num_tokens, num_layers)

    def escalate(self, policy_logits: torch.Tensor, naive_logits: torch.Tensor | None) -> bool:
        """Whether this request must be recomputed in full."""
        if naive_logits is None:  # no relevance pass ran (nothing was reused)
            return False
        return guard_signal(policy_logits, naive_logits) > self.threshold
