"""A seeded synthetic reading-comprehension set over reusable documents (issue 7).

Every fact is invented (made-up names of rivers, towns, people, with random numbers, years and
colours), so an answer can only come from the documents in the prompt. Each example has 3–4
short documents (~40–80 tokens each) and one question whose one-word answer is in one of them.

Cases, built like the image cases of vlcache.workloads.cases (each document is cached *alone*,
under another system prompt and "Summarize this document:", so its cached KV never attended to
the other documents):
- `shuffle`: another system prompt, the documents in a shuffled order, then the question;
- `before`: the question comes before the documents;
- `refer`: the answer's document does not name its subject ("The river that visitors ask about
  in the previous document flows through ...") and is shown right after a document that ends
  "Visitors often ask about the river Omblen.", so its meaning depends on preceding text its
  cached KV never saw; the question names the subject.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Any

from vlcache.workloads.cases import Case

KINDS = ("shuffle", "before", "refer")

CACHE_SYSTEM = "You are a librarian who writes short, faithful summaries of archive documents."
CACHE_QUESTION = "Summarize this document:"
EVAL_SYSTEM = ("You are a precise assistant. Answer questions using only the documents "
               "provided, with a single word or number.")
INSTRUCTION = "Answer with one word or number only."

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gl",
           "kr", "pl", "st", "th", "tr", "vl", "sk"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "k", "th", "m", "sk", "rn"]
COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey",
           "brown", "pink", "silver"]
JOBS = ["baker", "sailor", "painter", "farmer", "doctor", "teacher", "miner", "weaver",
        "potter", "judge", "carpenter", "fisher"]
ANIMALS = ["heron", "otter", "lynx", "badger", "falcon", "stag", "wolf", "owl", "hare", "bear"]


def _name(rng: random.Random, syllables: int | None = None) -> str:
    n = syllables or rng.choice([2, 2, 3])
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n))
    return (word + rng.choice(_CODAS)).capitalize()


@dataclass(frozen=True)
class Fact:
    question: str  # about the subject, named
    answer: str


@dataclass(frozen=True)
class Doc:
    kind: str  # river, town, person, festival
    subject: str  # the name the question uses
    named: str  # the document text, naming its subject
    anaphoric: str  # the same facts, the subject only referred to via the previous document
    facts: tuple[Fact, ...]


def _doc(kind: str, subject: str, opener: str, tail: str, facts: tuple[Fact, ...]) -> Doc:
    """A document naming its subject (`opener tail`) and its anaphoric twin (same `tail`)."""
    return Doc(kind, subject, f"{opener} {tail}",
               f"The {kind} that visitors ask about in the previous document {tail}", facts)


def _river(rng: random.Random, town: str) -> Doc:
    name, sea = _name(rng), _name(rng)
    length, colour, fish = rng.randint(40, 990), rng.choice(COLOURS), _name(rng, 2).lower()
    tail = (f"flows through {town} and ends in the Sea of {sea}. It is {length} kilometres long. "
            f"Its water looks {colour} in spring, and fishermen there catch the {fish}.")
    return _doc("river", f"the river {name}", f"The river {name}", tail,
                (Fact(f"How many kilometres long is the river {name}?", str(length)),
                 Fact(f"What colour does the water of the river {name} look in spring?", colour),
                 Fact(f"Into which sea does the river {name} flow? (the name after 'Sea of')",
                      sea)))


def _town(rng: random.Random, town: str) -> Doc:
    year, people, mayor = rng.randint(1100, 1890), rng.randint(2, 98) * 1000, _name(rng)
    animal, colour = rng.choice(ANIMALS), rng.choice(COLOURS)
    tail = (f"was founded in the year {year} and has about {people} inhabitants. Its mayor is "
            f"Mayor {mayor}. The town flag is {colour} and shows a {animal}.")
    return _doc("town", town, f"The town of {town}", tail,
                (Fact(f"In which year was the town of {town} founded?", str(year)),
                 Fact(f"What is the name of the mayor of {town}?", mayor),
                 Fact(f"Which animal is shown on the flag of {town}?", animal),
                 Fact(f"What colour is the flag of {town}?", colour)))


def _person(rng: random.Random, town: str) -> Doc:
    first, last = _name(rng, 2), _name(rng)
    year, job, colour = rng.randint(1700, 1990), rng.choice(JOBS), rng.choice(COLOURS)
    pets = rng.randint(2, 9)
    tail = (f"was born in {town} in {year} and worked as a {job}. This person kept {pets} cats "
            f"and always wore a {colour} hat.")
    return _doc("person", f"{first} {last}", f"{first} {last}", tail,
                (Fact(f"In which year was {first} {last} born?", str(year)),
                 Fact(f"What did {first} {last} work as?", job),
                 Fact(f"How many cats did {first} {last} keep?", str(pets)),
                 Fact(f"What colour was the hat of {first} {last}?", colour)))


def _festival(rng: random.Random, town: str) -> Doc:
    name, month = _name(rng), rng.choice(["March", "April", "May", "June", "July", "October"])
    days, colour, food = rng.randint(2, 12), rng.choice(COLOURS), _name(rng, 2).lower()
    tail = (f"is held in {town} every {month} and lasts {days} days. Dancers wear {colour} "
            f"masks, and everyone eats a sweet bread called {food}.")
    return _doc("festival", f"the {name} festival", f"The {name} festival", tail,
                (Fact(f"How many days does the {name} festival last?", str(days)),
                 Fact(f"In which month is the {name} festival held?", month),
                 Fact(f"What colour are the masks at the {name} festival?", colour)))


MAKERS = (_river, _town, _person, _festival)


@dataclass(frozen=True)
class ReadingExample:
    """Documents (named texts), which one holds the answer, the question and the answer."""

    docs: tuple[Doc, ...]
    target: int
    fact: Fact
    source: str
    group: str  # the documents' identity: examples sharing documents stay in one half
    seed: int

    @property
    def answer(self) -> str:
        return self.fact.answer


def make_example(seed: int, index: int) -> ReadingExample:
    rng = random.Random(seed * 1_000_003 + index)
    num = rng.choice([3, 4])
    towns = [_name(rng) for _ in range(num)]
    kinds = rng.sample(MAKERS, num)
    docs = tuple(make(rng, town) for make, town in zip(kinds, towns, strict=True))
    target = rng.randrange(num)
    fact = rng.choice(docs[target].facts)
    return ReadingExample(docs, target, fact, f"reading/{index}/{docs[target].kind}",
                          f"reading/{index}", seed)


def load_reading(limit: int, seed: int = 7) -> list[ReadingExample]:
    return [make_example(seed, i) for i in range(limit)]


def document_part(text: str) -> dict[str, Any]:
    return {"type": "document", "text": text}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def cached_alone(text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": CACHE_SYSTEM},
            {"role": "user", "content": [text_part(CACHE_QUESTION), document_part(text)]}]


def make_case(kind: str, ex: ReadingExample) -> Case:
    """The case of `kind` on `ex`: documents shuffled (seeded), each cached alone."""
    if kind not in KINDS:
        raise ValueError(f"unknown reading case kind {kind!r}: expected one of {', '.join(KINDS)}")
    rng = random.Random(zlib.crc32(f"{ex.seed}/{ex.source}/{kind}".encode()))
    order = list(range(len(ex.docs)))
    rng.shuffle(order)
    texts = [ex.docs[i].named for i in order]
    if kind == "refer":
        # the answer's document right after the one that names its subject, which it only
        # refers to
        target = ex.docs[ex.target]
        others = [i for i in order if i != ex.target]
        pointer = f"{ex.docs[others[0]].named} Visitors often ask about {target.subject}."
        texts = [pointer, target.anaphoric, *[ex.docs[i].named for i in others[1:]]]
    ask = f"{ex.fact.question} {INSTRUCTION}"
    parts: list[dict[str, Any]] = [
        text_part(f"Question: {ask}\nDocuments:" if kind == "before" else "Documents:")]
    for k, text in enumerate(texts):
        parts += [text_part(f"\n[{k + 1}] "), document_part(text)]
    if kind != "before":
        parts.append(text_part(f"\nQuestion: {ask}"))
    messages = [{"role": "system", "content": EVAL_SYSTEM}, {"role": "user", "content": parts}]
    return Case(messages, [cached_alone(t) for t in texts], ex.answer, kind, ex.source)


def build_cases(examples: list[ReadingExample], kinds: tuple[str, ...] = KINDS) -> list[Case]:
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown reading case kind {kind!r}: expected one of "
                             f"{', '.join(KINDS)}")
    return [make_case(kinds[i % len(kinds)], ex) for i, ex in enumerate(examples)]
