"""Which request runs when. Within a round every case runs once on each engine, the two engines
back to back for the same case (so a slow patch of a shared machine hits both alike); the case
order rotates by one each round and the engine that goes first alternates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    size: int  # image tokens
    round: int
    case: str
    engine: str

    @property
    def key(self) -> tuple[int, int, str, str]:
        return (self.size, self.round, self.case, self.engine)


def rotate(items: list[str], k: int) -> list[str]:
    k = k % len(items) if items else 0
    return items[k:] + items[:k]


def plan(sizes: Iterable[int], rounds: int, cases: list[str], engines: list[str]) -> list[Step]:
    """Every (size, round, case, engine), sizes in the order given, then rounds."""
    return [Step(size, r, case, engine)
            for size in sizes for r in range(rounds)
            for case in rotate(cases, r) for engine in rotate(engines, r)]


def pending(steps: list[Step], done: set[tuple[int, int, str, str]]) -> list[Step]:
    """The steps not yet done (a resumed run), in their order."""
    return [s for s in steps if s.key not in done]
