"""Exact prefix caching, the rule today's engines follow: reuse an image's KV only when
everything before it is identical to when the KV was computed.

The comparison is on a digest of the image's context: the token ids before its first token and
the keys of the images among them (their placeholder tokens alone do not say which image they
were). The engine stores the digest with each new entry and asks the policy before reusing.
"""

from __future__ import annotations

import blake3
import numpy as np
import torch

from vlcache.reuse.policy import Policy, TokenSchedule, UniformPolicy


def context_digest(
    input_ids: torch.Tensor,  # [S]
    start: int,  # the image's first token
    earlier_keys: list[str],  # keys of the images that start before `start`, in order
) -> torch.Tensor:  # [32] uint8
    h = blake3.blake3()
    h.update(np.ascontiguousarray(input_ids[:start].cpu().numpy().astype(np.int64)).tobytes())
    for key in earlier_keys:
        h.update(b"\0" + key.encode())
    return torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8)


class PrefixPolicy(Policy):
    """Encoder output always reused; KV reused in full only after an identical prefix.

    On a prefix match the cached KV is exactly what a full prefill computes (r = 0 loses
    nothing); otherwise the image is computed at every layer, as with `encoder`.
    """

    name = "prefix"

    def may_reuse(self, cached_context: torch.Tensor | None, context: torch.Tensor) -> bool:
        return cached_context is not None and torch.equal(cached_context.cpu(), context.cpu())

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        return UniformPolicy(0.0).schedule(num_tokens, num_layers)
