"""Agreement of a prefilled arm with full's greedy answer, teacher-forced.

An arm's greedy answer equals full's reference r_0 .. r_{n-1} exactly when, fed full's own
tokens, it predicts each next one: argmax p(· | prompt) = r_0 and argmax p(· | r_<i) = r_i for
every i (and, when full stopped before the cap, an end-of-turn token after r_{n-1}). So one forward
pass over the reference decides exact@N, instead of N decoding steps. Only where the arm diverges
does it decode on, from the first differing token, until its first answer word is complete (the
accuracy check reads the first words only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from vlcache.engine import Engine
from vlcache.engine.engine import PrefillRun
from vlcache.models.adapter import QwenVLAdapter
from vlcache.reuse.decode import decode_step
from vlcache.reuse.kvcache import KVCache
from vlcache.reuse.rope import apply_rope


def forced_logits(adapter: QwenVLAdapter, cache: KVCache, tokens: list[int],
                  position: int) -> torch.Tensor:  # [t, V] float32
    """Logits after each of `tokens`, fed at `position`, `position + 1`, ... (text positions, the
    same on all M-RoPE axes), appended to `cache`: `decode_step` for t tokens at once."""
    t = len(tokens)
    device = adapter.device
    h = adapter.embed(torch.tensor(tokens))  # [t, H]
    pos = torch.arange(position, position + t, device=device).expand(3, t)  # [3, t]
    cos, sin = adapter.rope_tables(pos)  # [t, d]
    past = cache.length
    # new token i sees the whole prompt and new tokens 0..i
    mask = torch.ones(t, past + t, dtype=torch.bool, device=device)  # [t, T + t]
    mask[:, past:] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, h)  # [t, nh, d], [t, kvh, d], [t, kvh, d]
        keys, values = cache.append(layer, apply_rope(k, cos, sin), v)  # [kvh, T + t, d]
        qh = apply_rope(q, cos, sin).transpose(0, 1)[None]  # [1, nh, t, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            qh, keys[None], values[None], attn_mask=mask, scale=adapter.scaling, enable_gqa=True)
        h = adapter.finish(layer, h, out[0].transpose(0, 1).reshape(t, -1))
    cache.length += t
    return adapter.logits(h)


@dataclass(frozen=True)
class Agreement:
    exact: bool  # greedy answer identical to the reference (the first `cap` tokens)
    tokens: list[int]  # the arm's greedy answer: the reference where exact, else up to its
    # first complete answer word after the divergence


def words_done(text: str, words: int) -> bool:
    """Whether `text` holds `words` complete words (each followed by a non-alphanumeric)."""
    text = text.lower()
    found = len(re.findall(r"[a-z0-9]+", text))
    open_word = bool(text) and re.match(r"[a-z0-9]", text[-1]) is not None
    return found - open_word >= words


def agree(engine: Engine, run: PrefillRun, reference: list[int], cap: int,
          answer_words: int = 0) -> Agreement:
    """Teacher-forced exact@cap of `run` against full's greedy `reference` (at most `cap`
    tokens, no end token); diverging arms decode on until `answer_words` words are complete
    (0: not at all)."""
    position = int(run.positions.max()) + 1
    first = int(run.output.logits.argmax())
    predicted = [first]  # predicted[i]: the arm's choice after reference[:i]
    if reference and first == reference[0]:
        feed = reference[: cap - 1] if len(reference) >= cap else reference
        with torch.inference_mode():
            logits = forced_logits(engine.adapter, run.output.cache, feed, position)
        predicted += logits.argmax(dim=-1).tolist()
    for i, token in enumerate(predicted):
        if i == len(reference):  # full stopped here: so must the arm
            if token in engine.stop_ids:
                break
            return Agreement(False, _diverge(engine, run, reference, token, position, cap,
                                             answer_words))
        if token != reference[i]:
            return Agreement(False, _diverge(engine, run, reference[:i], token, position, cap,
                                             answer_words))
    return Agreement(True, list(reference))


def _diverge(engine: Engine, run: PrefillRun, prefix: list[int], token: int, position: int,
             cap: int, answer_words: int) -> list[int]:
    """The arm's greedy answer from its first differing `token` on (after `prefix`, which it
    shares with the reference), until `answer_words` words are complete."""
    cache = run.output.cache
    cache.length = int(run.positions.shape[1]) + len(prefix)  # drop the forced tokens after it
    tokens = list(prefix)
    position += len(prefix)

    def done() -> bool:
        text = engine.tokenizer.decode(tokens, skip_special_tokens=True)
        return answer_words == 0 or words_done(text, answer_words)

    with torch.inference_mode():
        while token not in engine.stop_ids and len(tokens) < cap:
            tokens.append(token)
            if done() or len(tokens) == cap:
                break
            token = int(decode_step(engine.adapter, cache, token, position).argmax())
            position += 1
    return tokens
