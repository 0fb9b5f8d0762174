"""Every timed request as one CSV row, appended as it is measured (so a run that stops can
resume and a report can be redone from the file)."""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sample:
    size: int  # image tokens per image
    round: int
    case: str
    engine: str
    ttft_s: float | None = None  # None: the request failed (see error)
    cpu_s: float | None = None  # CPU time of the engine's processes during the request
    cpu_top_s: float | None = None  # of which its busiest thread (the compute)
    prompt_tokens: int | None = None
    cached_tokens: float | None = None  # as the engine reports it
    computed_tokens: float | None = None  # vlcache: per layer, mean; vLLM: prompt - cached
    text: str = ""
    error: str = ""
    load1: float | None = None  # 1-minute load average when the request ended
    at: str = ""  # ISO time

    @property
    def ok(self) -> bool:
        return self.ttft_s is not None and not self.error

    @property
    def key(self) -> tuple[int, int, str, str]:
        return (self.size, self.round, self.case, self.engine)


FIELDS = [f.name for f in dataclasses.fields(Sample)]
_TYPES = {"size": int, "round": int, "ttft_s": float, "cpu_s": float, "cpu_top_s": float,
          "prompt_tokens": int,
          "cached_tokens": float, "computed_tokens": float, "load1": float}


def append(path: Path, sample: Sample) -> None:
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        if new:
            w.writeheader()
        w.writerow({k: "" if v is None else v for k, v in dataclasses.asdict(sample).items()})


def read(path: Path) -> list[Sample]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [Sample(**{k: _parse(k, v) for k, v in row.items() if k in FIELDS})
                for row in csv.DictReader(f)]


def _parse(name: str, value: str):
    if name not in _TYPES:
        return value
    return None if value == "" else _TYPES[name](value)
