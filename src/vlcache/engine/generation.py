"""Decoding after the prefill: the token loop, text with stop strings held back, greedy runs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from vlcache.models.adapter import DecoderAdapter
from vlcache.reuse.decode import decode_step
from vlcache.reuse.kvcache import KVCache


def continue_tokens(adapter: DecoderAdapter, cache: KVCache, first: int, position: int,
                    choose: Callable[[torch.Tensor], int]) -> Iterator[int]:
    """`first`, then each next token chosen from the logits of the one before; a token's
    decoding step runs only when the caller asks for the token after it."""
    token = first
    while True:
        yield token
        with torch.inference_mode():
            logits = decode_step(adapter, cache, token, position)  # [V]
        position += 1
        token = choose(logits)


def greedy_tokens(adapter: DecoderAdapter, cache: KVCache, first_logits: torch.Tensor,
                  position: int, stop_ids: set[int], max_tokens: int,
                  reference: list[int] | None = None, after_divergence: int = 4) -> list[int]:
    """Greedy continuation (stops at an end-of-turn token or after `max_tokens`).

    With a `reference`, decoding also stops `after_divergence` tokens after the first token
    that differs from it: the exact match is decided, and the first word (for accuracy) is out.
    """
    tokens: list[int] = []
    diverged: int | None = None
    steps = continue_tokens(adapter, cache, int(first_logits.argmax()), position,
                            lambda logits: int(logits.argmax()))
    for token in steps:
        if token in stop_ids or len(tokens) >= max_tokens:
            break
        tokens.append(token)
        if diverged is None and reference is not None and (
                len(tokens) > len(reference) or reference[len(tokens) - 1] != token):
            diverged = len(tokens)
        if len(tokens) >= max_tokens or (diverged is not None
                                         and len(tokens) >= diverged + after_divergence):
            break  # before the next decoding step
    return tokens


class TextStream:
    """Decoded text of a growing token list, released only where no stop string can still start
    and no multi-byte character is half decoded."""

    def __init__(self, tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.holdback = max((len(s) - 1 for s in stops if s), default=0)  # "" never matches
        self.text = ""
        self.emitted = 0

    def update(self, tokens: list[int]) -> bool:
        """Decode `tokens`; True (and the text cut there) when a stop string appeared."""
        self.text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        hits = [self.text.find(s) for s in self.stops if s and s in self.text]
        if hits:
            self.text = self.text[:min(hits)]
            return True
        return False

    def release(self) -> str:
        """The text that is safe to show now and was not shown before."""
        safe = len(self.text) - self.holdback if not self.text.endswith("\ufffd") \
            else self.emitted
        if safe <= self.emitted:
            return ""
        out, self.emitted = self.text[self.emitted:safe], safe
        return out

    def rest(self) -> str:
        return self.text[self.emitted:]


def stop_token_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return {i for i in ids if i is not None}


def turn_token_ids(tokenizer) -> set[int]:
    """Tokens that open a chat turn (ChatML's <|im_start|>, Llama 3's header), where known."""
    ids = set()
    for tok in ("<|im_start|>", "<|start_header_id|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids
