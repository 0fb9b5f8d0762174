"""Evaluation cases: a prompt to answer and, for each of its segments (images), the *other*
request that cached it: each image's cache is built under a different context than the prompt
that reuses it, which is the situation position-independent reuse is for.

Kinds, taken in turn; a lone image after an unchanged prefix barely suffers from reuse, so each
kind changes what the image's cached KV attended to:
- `single`: cached under another system prompt + "Describe this image.", asked with the default
  system prompt and the question after the image;
- `before`: the same cache, but the question comes *before* the image, so the image's KV should
  reflect an instruction it never saw;
- `far`: cached under a very different prompt (another task, a long unrelated preamble);
- `reorder`: two images, each cached alone, shown together in the other order (the cached KV of
  the second one carries no attention to the first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

if TYPE_CHECKING:
    from vlcache.engine import Engine

KINDS = ("single", "before", "far", "reorder")

CACHE_SYSTEM = "You are a careful assistant that writes detailed image descriptions."
CACHE_QUESTION = "Describe this image."
FAR_SYSTEM = ("You are a contract-law translator. Translate every passage into formal German "
              "and keep all clause numbers unchanged.")
FAR_PREAMBLE = ("Clause 14.2: The lessee shall maintain the premises in good repair, return all "
                "keys at the end of the term, and notify the lessor in writing of any defect "
                "within ten business days. Clause 14.3 follows the attached figure:")


@dataclass(frozen=True)
class Example:
    """One (image, question, answer) item of a data set; `answer` None when unknown."""

    image: Image.Image
    question: str
    answer: str | None
    source: str  # where it came from, for the report
    group: str = ""  # the image's identity: examples sharing an image stay in one half


@dataclass
class Case:
    messages: list[dict[str, Any]]  # the evaluated prompt
    cache_messages: list[list[dict[str, Any]]]  # per segment: the request that caches it
    answer: str | None
    kind: str
    source: str
    images: list[Image.Image] = field(default_factory=list)


def _user(*parts: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image", "image": p}
               for p in parts]
    return {"role": "user", "content": content}


ABOUT_SECOND = "Answer about image 2. "


def reorder_parts(first: Any, second: Any, question: str) -> list[Any]:
    """A two-image prompt's parts (text or image): the question is about the second image."""
    return ["Image 1:", first, "Image 2:", second, f"{ABOUT_SECOND}{question}"]


def _cached_alone(image: Image.Image, far: bool = False) -> list[dict[str, Any]]:
    if far:
        return [{"role": "system", "content": FAR_SYSTEM}, _user(FAR_PREAMBLE, image, "Translate.")]
    return [{"role": "system", "content": CACHE_SYSTEM}, _user(image, CACHE_QUESTION)]


def make_case(kind: str, ex: Example, other: Example | None = None) -> Case:
    """The case of `kind` built on `ex` (`reorder` also shows `other`'s image, first)."""
    if kind == "single":
        return Case([_user(ex.image, ex.question)], [_cached_alone(ex.image)], ex.answer, kind,
                    ex.source, [ex.image])
    if kind == "before":
        return Case([_user(ex.question, ex.image)], [_cached_alone(ex.image)], ex.answer, kind,
                    ex.source, [ex.image])
    if kind == "far":
        return Case([_user(ex.image, ex.question)], [_cached_alone(ex.image, far=True)],
                    ex.answer, kind, ex.source, [ex.image])
    if kind == "reorder":
        if other is None:
            raise ValueError("a reorder case needs a second example")
        prompt = _user(*reorder_parts(other.image, ex.image, ex.question))
        return Case([prompt], [_cached_alone(ex.image), _cached_alone(other.image)], ex.answer,
                    kind, f"{ex.source} after {other.source}", [other.image, ex.image])
    raise ValueError(f"unknown case kind {kind!r}: expected one of {', '.join(KINDS)}")


def build_cases(examples: list[Example], kinds: tuple[str, ...] = KINDS) -> list[Case]:
    """One case per example, kinds taken in turn; a reorder case shows the next example with
    another image first."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown case kind {kind!r}: expected one of {', '.join(KINDS)}")
    cases = []
    for i, ex in enumerate(examples):
        kind = kinds[i % len(kinds)]
        other = None
        if kind == "reorder":
            others = [e for e in examples[i + 1:] + examples[:i] if e.group != ex.group]
            other = others[0] if others else None
            kind = kind if other is not None else "single"
        cases.append(make_case(kind, ex, other))
    return cases


def split_examples(examples: list[Example]) -> tuple[list[Example], list[Example]]:
    """(planning half, held-out half), alternating by image so no image is in both."""
    groups = list(dict.fromkeys(ex.group or ex.source for ex in examples))
    planning = set(groups[0::2])
    first = [ex for ex in examples if (ex.group or ex.source) in planning]
    second = [ex for ex in examples if (ex.group or ex.source) not in planning]
    return first, second


def prime(engine: Engine, case: Case) -> None:
    """Cache each segment (image or document) of `case` in its own other context (replacing any
    earlier entry)."""
    for messages in case.cache_messages:
        engine.forget(messages)
        engine.prefill(messages, policy="full")
