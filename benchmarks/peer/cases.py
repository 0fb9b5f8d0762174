"""The requests, as JSON-able specs both workers turn into their own messages.

Per image size N, two untimed set-up requests cache image A (then A and B together); each round
then times, on both engines:

- miss: a fresh image (new each round) with the set-up's system prompt and question;
- same: the exact prompt that cached A;
- moved: another system prompt first (new each round) and the question before A;
- swapped: another system prompt (new each round), then B and A, the set-up's pair reversed;
- long: A where it was cached, then a long text (new each round) and the question.

What changes each round changes *before* the cached image, so an engine's prefix cache cannot
serve a round from the previous round's request: only the set-up counts as "seen before".
"""

from __future__ import annotations

import random
from collections.abc import Callable

CASES = ("miss", "same", "moved", "swapped", "long")
SYSTEM = "You are a helpful assistant."
QUESTION = "Describe this picture in one word."
PAIR_QUESTION = "Which of the two pictures is brighter? Answer in one word."
WORDS = ("the report notes that each image was taken at a station near the river where the "
         "team measured light water wind and colour over several days before they wrote a "
         "summary of what changed between morning and evening and why it matters").split()

Messages = list[dict]
DESCRIPTIONS = {
    "miss": "a fresh noise image (new each round), the set-up's system prompt and question: "
            "nothing to reuse but the system prompt's tokens",
    "same": "the exact prompt that cached image A in the set-up (system prompt, A, question)",
    "moved": "image A after another system prompt (new each round) and the question: the "
             "image's tokens sit at new positions",
    "swapped": "images B then A after another system prompt (new each round); the set-up "
               "cached A then B",
    "long": "image A where the set-up cached it, then ~{long} tokens of text (new each round) "
            "and the question",
}


def image(tokens: int, seed: int) -> dict:
    return {"type": "image", "tokens": tokens, "seed": seed}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def seed_for(tokens: int, role: str, round_index: int = 0) -> int:
    """A distinct noise seed per size and role: A and B fixed, the miss's fresh per round."""
    base = {"A": 1, "B": 2}.get(role)
    if base is not None:
        return tokens * 10 + base
    if role != "fresh":
        raise ValueError(f"unknown image role {role!r}")
    return 1_000_000 + tokens * 1_000 + round_index


def other_system(round_index: int) -> str:
    return f"You are a careful assistant; this is conversation {round_index}."


def long_text(round_index: int, tokens: int,
              trim: Callable[[str, int], str] | None = None) -> str:
    """About `tokens` tokens of plain words, different each round; `trim` cuts a text to
    exactly `tokens` tokens of the model's tokenizer (default: one word = one token)."""
    rng = random.Random(round_index)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens))
    return trim(words, tokens) if trim is not None else words


def setup_requests(tokens: int) -> list[tuple[str, Messages]]:
    """Untimed requests that put A (alone) and the pair A, B into each engine's cache."""
    a, b = image(tokens, seed_for(tokens, "A")), image(tokens, seed_for(tokens, "B"))
    sys = {"role": "system", "content": SYSTEM}
    return [("cache", [sys, {"role": "user", "content": [a, text(QUESTION)]}]),
            ("cache-pair", [sys, {"role": "user", "content": [a, b, text(PAIR_QUESTION)]}])]


def timed_request(case: str, tokens: int, round_index: int, long_tokens: int = 2048,
                  trim: Callable[[str, int], str] | None = None) -> Messages:
    """The request of `case` at image size `tokens` in round `round_index`."""
    a, b = image(tokens, seed_for(tokens, "A")), image(tokens, seed_for(tokens, "B"))
    sys = {"role": "system", "content": SYSTEM}
    other = {"role": "system", "content": other_system(round_index)}
    if case == "miss":
        fresh = image(tokens, seed_for(tokens, "fresh", round_index))
        return [sys, {"role": "user", "content": [fresh, text(QUESTION)]}]
    if case == "same":
        return setup_requests(tokens)[0][1]
    if case == "moved":
        return [other, {"role": "user", "content": [text(QUESTION), a]}]
    if case == "swapped":
        return [other, {"role": "user", "content": [b, a, text(PAIR_QUESTION)]}]
    if case == "long":
        body = long_text(round_index, long_tokens, trim)
        return [sys, {"role": "user", "content": [a, text(body + "\n" + QUESTION)]}]
    raise ValueError(f"unknown case {case!r}; known: {', '.join(CASES)}")


def images_in(messages: Messages) -> int:
    return sum(1 for m in messages if isinstance(m["content"], list)
               for p in m["content"] if p["type"] == "image")
