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
    exact: bool = True,  # False: an earlier segment was reused approximately
) -> torch.Tensor:  # [32] uint8
    """The digest a segment's KV is stored and looked up under. KV computed after an earlier
    segment that was reused approximately gets a digest no lookup asks for (`exact=False`), so
    only KV computed behind an exactly computed prefix counts as an identical-prefix hit."""
    h = blake3.blake3()
    if not exact:
        h.update(b"\1inexact")
    h.update(np.ascontiguousarray(input_ids[:start].cpu().numpy().astype(np.int64)).tobytes())
    for key in earlier_keys:
        h.update(b"\0" + key.encode())
    return torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8)


class PrefixPolicy(Policy):
    """Encoder output always reused; KV reused in full only after an identical prefix.

    On a prefix match the cached KV is exactly what a full prefill computes (r = 0 loses
    nothing); otherwise the image is computed at every layer, as with `encoder`. (Every policy
    that reuses KV takes such a match at r = 0 too: the engine checks it first.)
    """

    name = "prefix"

    def may_reuse(self, cached_context: torch.Tensor | None, context: torch.Tensor) -> bool:
        return cached_context is not None and torch.equal(cached_context.cpu(), context.cpu())

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        return UniformPolicy(0.0).schedule(num_tokens, num_layers)
