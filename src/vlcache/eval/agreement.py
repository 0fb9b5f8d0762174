"""Agreement of a prefilled arm with full's greedy answer, teacher-forced.

An arm's greedy answer equals full's reference r_0 .. r_{n-1} exactly when, fed full's own
tokens, it predicts each next one: argmax p(· | prompt) = r_0 and argmax p(· | r_<i) = r_i for
every i (and, when full stopped before the cap, an end-of-turn token after r_{n-1}). So one forward
pass over the reference decides exact@N, instead of N decoding steps; and the arms of one prompt
share that pass (their rows go through each layer's weights together, each attending to its own
cache). Only where an arm diverges does it decode on, from the first differing token, until its
first answer word is complete (the accuracy check reads the first words only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from vlcache.engine import Engine
from vlcache.engine.engine import PrefillRun


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
    return agree_all(engine, [run], reference, cap, answer_words)[0]


def agree_all(engine: Engine, runs: list[PrefillRun], reference: list[int], cap: int,
              answer_words: int = 0) -> list[Agreement]:
    """`agree` for the arms of one prompt, with one forced pass for all of them."""
    predicted = [[int(run.output.logits.argmax())] for run in runs]  # [i]: after reference[:i]
    forced = [a for a, p in enumerate(predicted) if reference and p[0] == reference[0]]
    if forced:
        feed = reference[: cap - 1] if len(reference) >= cap else reference
        position = int(runs[0].positions.max()) + 1
        with torch.inference_mode():
            logits = engine.forced_logits([runs[a] for a in forced], feed, position)  # [A,t,V]
        for a, choices in zip(forced, logits.argmax(dim=-1).tolist(), strict=True):
            predicted[a] += choices
    return [_verdict(engine, run, p, reference, cap, answer_words)
            for run, p in zip(runs, predicted, strict=True)]


def _verdict(engine: Engine, run: PrefillRun, predicted: list[int], reference: list[int],
             cap: int, answer_words: int) -> Agreement:
    position = int(run.positions.max()) + 1
    for i, token in enumerate(predicted):
        if i == len(reference):  # full stopped here: so must the arm
            if token in engine.end_tokens:
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
        text = engine.decode_text(tokens)
        return answer_words == 0 or words_done(text, answer_words)

    with torch.inference_mode():
        while token not in engine.end_tokens and len(tokens) < cap:
            tokens.append(token)
            if done() or len(tokens) == cap:
                break
            token = int(engine.decode_step(cache, token, position).argmax())
            position += 1
    return tokens
