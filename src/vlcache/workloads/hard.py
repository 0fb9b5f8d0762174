"""The hard-case reading set (issue 24): where reusing documents cached elsewhere changes answers.

Built on vlcache.workloads.reading's invented facts (made-up towns, rivers, people, festivals, ships
with random numbers, years, colours), so an answer can only come from the prompt's documents,
with longer documents: a document is a named opening sentence, more fact sentences and neutral
filler, from ~45 tokens (`short`) to ~100-150 (`medium`) and ~200-300 (`long`). A prompt has 2-6
documents, each cached under another context (another system prompt and "Summarize this
document:", as in reading.py), and one question with a one-word or number answer.

Kinds (the documents shown in a seeded order; each cached alone unless said):
- `after`: the question after the documents;
- `before`: the question before them (their cached KV never read it);
- `between`: the question between them (the answer's document on either side);
- `reorder`: the documents cached *together*, in one request, then shown in another order (each
  one's cached KV read the others in the old order);
- `lookalike`: every document from one template (the same sentences, other names and numbers);
- `multihop`: the answer needs a fact from two documents ("In which year was the town where
  Dora Klimsk was born founded?": Dora's document names the town, the town's document the year),
  sometimes three (the town's mayor has a document of their own); a distractor pair points to
  another town;
- `refer`: the answer's document does not name its subject ("The river that visitors ask about
  in the previous document ...") and follows the document that does.

`load_examples("hard")` returns example slots (a seed and an index; halves alternate by slot);
`build_cases(slots, kinds)` draws each slot's documents for the kind it gets, seeded by
(seed, index, kind), so the same arguments always give the same prompts.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vlcache.workloads.cases import Case
from vlcache.workloads.reading import (
    ANIMALS,
    CACHE_SYSTEM,
    COLOURS,
    JOBS,
    _name,
    cached_alone,
    document_part,
    text_part,
)

KINDS = ("after", "before", "between", "reorder", "lookalike", "multihop", "refer")
DEFAULT_SEED = 24

EVAL_SYSTEM = "Answer questions using only the documents provided."
INSTRUCTION = "Answer with one word or number only."
CACHE_TOGETHER = "Summarize these documents:"

# Document sizes: (fact sentences after the first, filler sentences), and how often each is drawn.
SIZES = {"short": ((2, 2), (0, 0)), "medium": ((5, 6), (2, 3)), "long": ((10, 10), (5, 8))}
SIZE_WEIGHTS = {"short": 3, "medium": 2, "long": 1}
DOCS = (2, 6)  # documents per prompt
PARTS = 11  # fact sentences of every document kind

MONTHS = ["March", "April", "May", "June", "July", "October", "November", "January"]
CARGO = ["salt", "wool", "timber", "grain", "coal", "wine", "copper", "cheese"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TREES = ["oak", "linden", "chestnut", "elm", "ash", "maple", "willow", "pine", "birch"]
PLACES = ["harbour", "chapel", "mill", "library", "orchard", "bakery", "bridge", "square"]
FLOWERS = ["roses", "lilies", "daisies", "tulips", "poppies", "violets", "irises"]

FILLER = (
    "Many old songs of the region mention {it}.",
    "Travellers often write about {it} in their letters home.",
    "Old maps show {it} under a slightly different name.",
    "Local historians still argue about the early records of {it}.",
    "A small museum keeps drawings and notes about {it}.",
    "Children in the region learn about {it} at school.",
    "Several paintings of {it} hang in the national gallery.",
    "The stories told about {it} change a little with every generation.",
    "Some of the early documents about {it} were lost in a fire.",
    "Scholars from abroad visit the archive to read about {it}.",
    "In the evenings, people gather to share stories about {it}.",
    "Nobody alive today remembers how things looked around {it} a century ago.",
    "The weather in the region is mild for most of the year.",
    "Guides say that the best time for a visit is early autumn.",
    "The archive holds letters, maps and receipts from many centuries.",
    "A newspaper once printed a long article about {it}.",
    "Visitors who come in summer find the region crowded and loud.",
    "The roads of the region were paved only in the last century.",
    "A few families have kept diaries that mention {it} for generations.",
    "Most of what is known about {it} comes from the town archive.",
    "Writers have described {it} in at least three novels.",
    "The regional council publishes a short guide that includes {it}.",
    "Photographs of {it} were first taken about a hundred years ago.",
    "Some details about {it} in older books are known to be wrong.",
)


@dataclass(frozen=True)
class Fact:
    """A question about a subject (`{s}` stands for how the question names it) and its answer."""

    template: str
    answer: str

    def ask(self, subject: str) -> str:
        return self.template.format(s=subject)


@dataclass(frozen=True)
class Part:
    text: str  # a sentence (the first one follows the document's opener)
    facts: tuple[Fact, ...]


@dataclass(frozen=True)
class Doc:
    kind: str  # town, person, river, festival, ship
    subject: str  # how a question names it: "the town of Vlaskorn"
    opener: str  # how the document names it: "The town of Vlaskorn"
    parts: tuple[Part, ...]  # parts[0] follows the opener
    filler: tuple[tuple[int, str], ...]  # (after which part, sentence)
    bridge: str | None = None  # the town this document places its subject in

    def _text(self, opener: str) -> str:
        sentences = []
        for i, part in enumerate(self.parts):
            sentences.append(f"{opener} {part.text}" if i == 0 else part.text)
            sentences += [s for after, s in self.filler if after == i]
        return " ".join(sentences)

    @property
    def named(self) -> str:
        return self._text(self.opener)

    @property
    def anaphoric(self) -> str:
        """The same text, its subject only referred to through the previous document."""
        return self._text(f"The {self.kind} that visitors ask about in the previous document")

    @property
    def facts(self) -> tuple[Fact, ...]:
        return tuple(f for p in self.parts for f in p.facts)


# --- document makers: every fact sentence of a kind; a template picks some of them ------------

def _town(rng: random.Random, name: str) -> tuple[str, str, list[Part], str | None]:
    year, people, mayor = rng.randint(1100, 1890), rng.randint(2, 98) * 1000, _name(rng)
    flag, roof = rng.sample(COLOURS, 2)
    animal, job = rng.choice(ANIMALS), rng.choice(JOBS)
    arches, km, poet = rng.randint(2, 19), rng.randint(3, 240), _name(rng)
    market, depth, tree = rng.choice(DAYS), rng.randint(5, 90), rng.choice(TREES)
    parts = [
        Part(f"was founded in the year {year} and has about {people} inhabitants.",
             (Fact("In which year was {s} founded?", str(year)),
              Fact("About how many inhabitants does {s} have?", str(people)))),
        Part(f"Its mayor is Mayor {mayor}.", (Fact("What is the name of the mayor of {s}?",
                                                   mayor),)),
        Part(f"The town flag is {flag} and shows a {animal}.",
             (Fact("What colour is the flag of {s}?", flag),
              Fact("Which animal is shown on the flag of {s}?", animal))),
        Part(f"The old bridge of the town has {arches} arches.",
             (Fact("How many arches does the old bridge of {s} have?", str(arches)),)),
        Part(f"Most people in the town work as a {job}.",
             (Fact("What do most people in {s} work as?", job),)),
        Part(f"The town hall has a {roof} roof.",
             (Fact("What colour is the roof of the town hall of {s}?", roof),)),
        Part(f"The town school is named after a poet called {poet}.",
             (Fact("After which poet is the school of {s} named?", poet),)),
        Part(f"The town lies {km} kilometres from the coast.",
             (Fact("How many kilometres from the coast does {s} lie?", str(km)),)),
        Part(f"Its market is held every {market}.",
             (Fact("On which day is the market of {s} held?", market),)),
        Part(f"The town well is {depth} metres deep.",
             (Fact("How many metres deep is the well of {s}?", str(depth)),)),
        Part(f"The oldest tree in the town is a {tree}.",
             (Fact("What kind of tree is the oldest tree in {s}?", tree),)),
    ]
    return f"the town of {name}", f"The town of {name}", parts, None


def _person(rng: random.Random, town: str, name: str | None = None
            ) -> tuple[str, str, list[Part], str | None]:
    name = name or f"{_name(rng, 2)} {_name(rng)}"
    year, job, hat = rng.randint(1700, 1990), rng.choice(JOBS), rng.choice(COLOURS)
    pets, books, age, trees = rng.randint(2, 9), rng.randint(2, 40), rng.randint(12, 70), \
        rng.randint(3, 60)
    friend, boat, away = _name(rng), _name(rng), _name(rng)
    langs, place, dish = rng.randint(2, 9), rng.choice(PLACES), _name(rng, 2).lower()
    parts = [
        Part(f"was born in {town} in {year} and worked as a {job}.",
             (Fact("In which year was {s} born?", str(year)),
              Fact("What did {s} work as?", job))),
        Part(f"This person kept {pets} cats.", (Fact("How many cats did {s} keep?", str(pets)),)),
        Part(f"This person always wore a {hat} hat.",
             (Fact("What colour was the hat of {s}?", hat),)),
        Part(f"This person wrote {books} books.",
             (Fact("How many books did {s} write?", str(books)),)),
        Part(f"The best friend of this person was called {friend}.",
             (Fact("What was the name of the best friend of {s}?", friend),)),
        Part(f"At the age of {age} this person moved to {away}.",
             (Fact(f"At what age did {{s}} move to {away}?", str(age)),)),
        Part(f"This person owned a boat named {boat}.",
             (Fact("What was the name of the boat of {s}?", boat),)),
        Part(f"The garden of this person had {trees} apple trees.",
             (Fact("How many apple trees were in the garden of {s}?", str(trees)),)),
        Part(f"This person spoke {langs} languages.",
             (Fact("How many languages did {s} speak?", str(langs)),)),
        Part(f"Every morning this person walked to the {place}.",
             (Fact("Where did {s} walk every morning?", place),)),
        Part(f"The favourite dish of this person was {dish}.",
             (Fact("What was the favourite dish of {s}?", dish),)),
    ]
    return name, name, parts, town


def _river(rng: random.Random, town: str) -> tuple[str, str, list[Part], str | None]:
    name, sea, mount = _name(rng), _name(rng), _name(rng)
    length, colour, fish = rng.randint(40, 990), rng.choice(COLOURS), _name(rng, 2).lower()
    bridges, cargo, month = rng.randint(2, 30), rng.choice(CARGO), rng.choice(MONTHS)
    width, tree, miller = rng.randint(10, 900), rng.choice(TREES), _name(rng)
    parts = [
        Part(f"flows through {town} and ends in the Sea of {sea}.",
             (Fact("Into which sea does {s} flow? (the name after 'Sea of')", sea),)),
        Part(f"It is {length} kilometres long.",
             (Fact("How many kilometres long is {s}?", str(length)),)),
        Part(f"Its water looks {colour} in spring.",
             (Fact("What colour does the water of {s} look in spring?", colour),)),
        Part(f"Fishermen there catch the {fish}.",
             (Fact("Which fish do fishermen catch in {s}?", fish),)),
        Part(f"It is crossed by {bridges} bridges.",
             (Fact("How many bridges cross {s}?", str(bridges)),)),
        Part(f"Its source lies on Mount {mount}.",
             (Fact("On which mountain is the source of {s}? (the name after 'Mount')", mount),)),
        Part(f"Boats on it carry {cargo}.", (Fact("What do boats on {s} carry?", cargo),)),
        Part(f"It freezes every {month}.", (Fact("In which month does {s} freeze?", month),)),
        Part(f"Its widest point measures {width} metres.",
             (Fact("How many metres wide is {s} at its widest point?", str(width)),)),
        Part(f"Many {tree} trees grow along its banks.",
             (Fact("Which trees grow along the banks of {s}?", tree),)),
        Part(f"An old mill on it was built by a miller called {miller}.",
             (Fact("What was the name of the miller who built the old mill on {s}?",
                   miller),)),
    ]
    return f"the river {name}", f"The river {name}", parts, town


def _festival(rng: random.Random, town: str) -> tuple[str, str, list[Part], str | None]:
    name, month, days = _name(rng), rng.choice(MONTHS), rng.randint(2, 12)
    colour, food, song = rng.choice(COLOURS), _name(rng, 2).lower(), _name(rng)
    year, animal, visitors = rng.randint(1300, 1950), rng.choice(ANIMALS), rng.randint(2, 90) * 100
    drums, boats, flower = rng.randint(3, 40), rng.randint(2, 30), rng.choice(FLOWERS)
    place = rng.choice(PLACES)
    parts = [
        Part(f"is held in {town} every {month} and lasts {days} days.",
             (Fact("In which month is {s} held?", month),
              Fact("How many days does {s} last?", str(days)))),
        Part(f"Dancers wear {colour} masks.",
             (Fact("What colour are the masks at {s}?", colour),)),
        Part(f"Everyone eats a sweet bread called {food}.",
             (Fact("What is the sweet bread eaten at {s} called?", food),)),
        Part(f"It was first held in {year}.", (Fact("In which year was {s} first held?",
                                                    str(year)),)),
        Part(f"Its winner receives a wooden {animal}.",
             (Fact("Which wooden animal does the winner of {s} receive?", animal),)),
        Part(f"About {visitors} visitors come every year.",
             (Fact("About how many visitors come to {s} every year?", str(visitors)),)),
        Part(f"The opening song is called {song}.",
             (Fact("What is the opening song of {s} called?", song),)),
        Part(f"The musicians play {drums} drums.",
             (Fact("How many drums do the musicians at {s} play?", str(drums)),)),
        Part(f"Its oldest tradition is a race of {boats} boats.",
             (Fact("How many boats race at {s}?", str(boats)),)),
        Part(f"The festival queen wears a crown of {flower}.",
             (Fact("What is the crown of the queen of {s} made of?", flower),)),
        Part(f"The last dance takes place at the {place}.",
             (Fact("Where does the last dance of {s} take place?", place),)),
    ]
    return f"the {name} festival", f"The {name} festival", parts, town


def _ship(rng: random.Random, town: str) -> tuple[str, str, list[Part], str | None]:
    name, captain, island = _name(rng), _name(rng), _name(rng)
    year, masts, crew = rng.randint(1500, 1900), rng.randint(1, 5), rng.randint(8, 300)
    sails, animal, cargo, bell = rng.choice(COLOURS), rng.choice(ANIMALS), rng.choice(CARGO), \
        rng.randint(20, 900)
    port, soup, crossing = _name(rng), _name(rng, 2).lower(), rng.randint(3, 60)
    parts = [
        Part(f"was built in {town} in {year} and has {masts} masts.",
             (Fact("In which year was {s} built?", str(year)),
              Fact("How many masts does {s} have?", str(masts)))),
        Part(f"Its captain is called {captain}.",
             (Fact("What is the name of the captain of {s}?", captain),)),
        Part(f"Its sails are {sails}.", (Fact("What colour are the sails of {s}?", sails),)),
        Part(f"It carries {crew} sailors.", (Fact("How many sailors does {s} carry?",
                                                  str(crew)),)),
        Part(f"Its figurehead shows a {animal}.",
             (Fact("Which animal does the figurehead of {s} show?", animal),)),
        Part(f"It often anchors near the island of {island}.",
             (Fact("Near which island does {s} often anchor?", island),)),
        Part(f"It carries {cargo} to the north.", (Fact("What does {s} carry to the north?",
                                                        cargo),)),
        Part(f"Its bell weighs {bell} kilograms.",
             (Fact("How many kilograms does the bell of {s} weigh?", str(bell)),)),
        Part(f"It once sailed to the port of {port}.",
             (Fact("To which port did {s} once sail? (the name after 'port of')", port),)),
        Part(f"Its cook is famous for a soup called {soup}.",
             (Fact("What is the soup the cook of {s} is famous for called?", soup),)),
        Part(f"It needs {crossing} days to cross the sea.",
             (Fact("How many days does {s} need to cross the sea?", str(crossing)),)),
    ]
    return f"the ship {name}", f"The ship {name}", parts, town


Maker = Callable[..., tuple[str, str, list[Part], str | None]]
MAKERS: dict[str, Maker] = {"town": lambda rng, town: _town(rng, town), "person": _person,
                            "river": _river, "festival": _festival, "ship": _ship}
# how a multi-hop question reaches the town through a document of each kind
VIA = {"person": "the town where {s} was born", "river": "the town that {s} flows through",
       "festival": "the town where {s} is held", "ship": "the town where {s} was built"}
IT = {"town": "the town", "person": "this person", "river": "the river",
      "festival": "the festival", "ship": "the ship"}


@dataclass(frozen=True)
class Template:
    """Which of a kind's sentences a document has, in which order, and where filler goes:
    look-alike documents share one template."""

    kind: str
    parts: tuple[int, ...]  # indices into the maker's parts; always starts with 0
    filler: tuple[tuple[int, int], ...]  # (after which of `parts`, FILLER index)


def _template(rng: random.Random, kind: str, size: str) -> Template:
    (lo, hi), (flo, fhi) = SIZES[size]
    rest = rng.sample(range(1, PARTS), rng.randint(lo, hi))
    count = rng.randint(flo, fhi)
    filler = tuple(sorted(zip(rng.choices(range(len(rest) + 1), k=count),
                              rng.sample(range(len(FILLER)), count), strict=True)))
    return Template(kind, (0, *rest), filler)


def _doc(rng: random.Random, template: Template, town: str, **kwargs: Any) -> Doc:
    subject, opener, parts, bridge = MAKERS[template.kind](rng, town, **kwargs)
    it = IT[template.kind]
    return Doc(template.kind, subject, opener, tuple(parts[i] for i in template.parts),
               tuple((after, FILLER[f].format(it=it)) for after, f in template.filler), bridge)


def _size(rng: random.Random) -> str:
    return rng.choices(list(SIZE_WEIGHTS), weights=list(SIZE_WEIGHTS.values()))[0]


def _random_doc(rng: random.Random, kind: str | None = None, town: str | None = None) -> Doc:
    kind = kind or rng.choice(list(MAKERS))
    return _doc(rng, _template(rng, kind, _size(rng)), town or _name(rng))


# --- examples ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """An example's place in the set; its documents are drawn for the kind it is given."""

    seed: int
    index: int

    @property
    def source(self) -> str:
        return f"hard/{self.index}"

    @property
    def group(self) -> str:
        return f"hard/{self.seed}/{self.index}"


@dataclass(frozen=True)
class HardExample:
    kind: str
    docs: tuple[str, ...]  # the document texts, in the order the prompt shows them
    cached_together: tuple[str, ...] | None  # `reorder`: the order they were cached in
    question: str
    answer: str
    # the facts the answer needs: (shown document index, strings that document states)
    hops: tuple[tuple[int, tuple[str, ...]], ...]
    source: str


def load_hard(limit: int, seed: int = DEFAULT_SEED) -> list[Slot]:
    return [Slot(seed, i) for i in range(limit)]


def _rng(slot: Slot, kind: str) -> random.Random:
    return random.Random(zlib.crc32(f"hard/{slot.seed}/{slot.index}/{kind}".encode()))


def _pick(rng: random.Random, doc: Doc) -> Fact:
    return rng.choice(doc.facts)


def make_example(slot: Slot, kind: str) -> HardExample:
    if kind not in KINDS:
        raise ValueError(f"unknown hard case kind {kind!r}: expected one of {', '.join(KINDS)}")
    rng = _rng(slot, kind)
    n = rng.randint(*DOCS)
    if kind == "multihop":
        return _multihop(rng, slot, n)
    if kind == "lookalike":
        template = _template(rng, rng.choice(list(MAKERS)), _size(rng))
        docs = [_doc(rng, template, _name(rng)) for _ in range(n)]
    else:
        docs = [_random_doc(rng) for _ in range(n)]
    target = rng.randrange(n)
    fact = _unique_fact(rng, docs, target) if kind == "lookalike" else _pick(rng, docs[target])
    order = list(range(n))
    rng.shuffle(order)
    if kind == "reorder" and order == sorted(order):
        order.reverse()
    texts = [docs[i].named for i in order]
    if kind == "refer":  # the answer's document right after the one that names its subject
        others = [i for i in order if i != target]
        pointer = f"{docs[others[0]].named} Visitors often ask about {docs[target].subject}."
        texts = [pointer, docs[target].anaphoric, *[docs[i].named for i in others[1:]]]
        order = [others[0], target, *others[1:]]
    shown = order.index(target)
    hops = ((shown, (fact.answer,)),)
    if kind == "refer":
        hops = ((shown - 1, (docs[target].subject,)), (shown, (fact.answer,)))
    together = tuple(d.named for d in docs) if kind == "reorder" else None
    return HardExample(kind, tuple(texts), together, fact.ask(docs[target].subject),
                       fact.answer, hops, f"{slot.source}/{kind}/{docs[target].kind}")


def _unique_fact(rng: random.Random, docs: list[Doc], target: int) -> Fact:
    """A fact of the target whose answer no other look-alike document gives for that sentence
    (so the question separates them), where there is one."""
    facts = docs[target].facts
    unique = [f for i, f in enumerate(facts)
              if all(d.facts[i].answer != f.answer for j, d in enumerate(docs) if j != target)]
    return rng.choice(unique or list(facts))


def _multihop(rng: random.Random, slot: Slot, n: int) -> HardExample:
    """A document placing its subject in a town, that town's document (and, for three hops,
    its mayor's), a distractor pair through another town, and other documents."""
    via = rng.choice(list(VIA))
    town, other_town = _name(rng), _name(rng)
    first = _random_doc(rng, via, town)
    town_doc = _doc(rng, _template(rng, "town", _size(rng)), town)
    chain = [first, town_doc]
    three = n >= 3 and rng.random() < 1 / 3
    if three:
        town_doc = _with_mayor(town_doc)
        mayor = _mayor(town_doc)
        chain[1] = town_doc
        chain.append(_doc(rng, _template(rng, "person", _size(rng)), _name(rng),
                          name=f"Mayor {mayor}"))
        fact = chain[2].facts[0]  # the mayor's birth year
        question = (f"The mayor of {VIA[via].format(s=first.subject)}: in which year was this "
                    "mayor born?")
    else:
        fact = _pick(rng, town_doc)
        question = fact.ask(VIA[via].format(s=first.subject))
    extra: list[Doc] = []
    if n - len(chain) >= 2:  # a look-alike pair through another town
        extra += [_random_doc(rng, via, other_town),
                  _doc(rng, _template(rng, "town", _size(rng)), other_town)]
    extra += [_random_doc(rng, rng.choice(["person", "river", "festival", "ship"]))
              for _ in range(n - len(chain) - len(extra))]
    docs = chain + extra
    order = list(range(len(docs)))
    rng.shuffle(order)
    shown = [order.index(i) for i in range(len(chain))]
    needs = [(first.opener, town), (town,) + ((_mayor(town_doc),) if three else (fact.answer,))]
    if three:
        needs.append((chain[2].opener, fact.answer))
    hops = tuple((s, need) for s, need in zip(shown, needs, strict=True))
    return HardExample("multihop", tuple(docs[i].named for i in order), None, question,
                       fact.answer, hops, f"{slot.source}/multihop/{via}{'+mayor' * three}")


def _with_mayor(doc: Doc) -> Doc:
    """The town document with its mayor sentence (the three-hop chain goes through it)."""
    if any(p.text.startswith("Its mayor is") for p in doc.parts):
        return doc
    name = _name(random.Random(zlib.crc32(doc.subject.encode())))
    mayor = Part(f"Its mayor is Mayor {name}.",
                 (Fact("What is the name of the mayor of {s}?", name),))
    return Doc(doc.kind, doc.subject, doc.opener, (doc.parts[0], mayor, *doc.parts[1:]),
               tuple((after + (after > 0), s) for after, s in doc.filler), doc.bridge)


def _mayor(doc: Doc) -> str:
    return next(p.facts[0].answer for p in doc.parts if p.text.startswith("Its mayor is"))


# --- cases -------------------------------------------------------------------------------------

def _cached_together(texts: tuple[str, ...]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [text_part(CACHE_TOGETHER)]
    for k, text in enumerate(texts):
        parts += [text_part(f"\n[{k + 1}] "), document_part(text)]
    return [{"role": "system", "content": CACHE_SYSTEM}, {"role": "user", "content": parts}]


def make_case(ex: HardExample) -> Case:
    ask = text_part(f"\nQuestion: {ex.question} {INSTRUCTION}")
    split = len(ex.docs) // 2 if ex.kind == "between" else len(ex.docs)
    parts: list[dict[str, Any]] = [text_part("Documents:")]
    if ex.kind == "before":
        parts = [text_part(f"Question: {ex.question} {INSTRUCTION}\nDocuments:")]
    for k, text in enumerate(ex.docs):
        if k == split:
            parts.append(ask)
        parts += [text_part(f"\n[{k + 1}] "), document_part(text)]
    if ex.kind != "before" and split == len(ex.docs):
        parts.append(ask)
    messages = [{"role": "system", "content": EVAL_SYSTEM}, {"role": "user", "content": parts}]
    cache = ([_cached_together(ex.cached_together)] if ex.cached_together is not None
             else [cached_alone(t) for t in ex.docs])
    return Case(messages, cache, ex.answer, ex.kind, ex.source)


def build_cases(slots: list[Slot], kinds: tuple[str, ...] = KINDS) -> list[Case]:
    """One case per slot, kinds taken in turn."""
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown hard case kind {kind!r}: expected one of "
                             f"{', '.join(KINDS)}")
    return [make_case(make_example(slot, kinds[i % len(kinds)])) for i, slot in enumerate(slots)]
