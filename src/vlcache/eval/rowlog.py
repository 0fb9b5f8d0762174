"""rows.jsonl: an evaluation's rows, one JSON object a line, each prompt's rows appended in one
write when the prompt finishes, so an interrupted run loses at most the prompt in flight.
Reading (which may rewrite the file) and appending hold an exclusive lock on `rows.lock`, so
several processes (`vlcache eval --shard`) can share one log."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

Key = tuple[str, int]  # (split, case index)


class RowLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, expected: dict[Key, tuple[int, str]]) -> dict[Key, list[dict]]:
        """The finished prompts' rows: those of a prompt in `expected` ({key: (rows, source)})
        with all its rows and the same source. Anything else (a prompt cut off mid-write, a
        prompt no longer asked for) is dropped, from the file too."""
        with self._locked():
            return self._read(expected)

    def _read(self, expected: dict[Key, tuple[int, str]]) -> dict[Key, list[dict]]:
        if not self.path.exists():
            return {}
        found: dict[Key, list[dict]] = {}
        lines = self.path.read_text().splitlines()
        for line in lines:
            try:
                row = json.loads(line)
                key = (row["split"], int(row["case"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut off by an interruption
            found.setdefault(key, []).append(row)
        done = {key: rows for key, rows in found.items() if key in expected
                and len(rows) == expected[key][0]
                and all(r.get("source") == expected[key][1] for r in rows)}
        kept = sum(len(rows) for rows in done.values())
        if kept != len(lines):  # rewrite without them (a new file replaces the old at once)
            partial = self.path.with_suffix(".partial")
            _write(partial, [row for rows in done.values() for row in rows], "w")
            os.replace(partial, self.path)
        return done

    def append(self, rows: list[dict]) -> None:
        with self._locked():
            _write(self.path, rows, "a")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.with_suffix(".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _write(path: Path, rows: list[dict], mode: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as f:
        f.write("".join(json.dumps(row, default=str) + "\n" for row in rows))
        f.flush()
        os.fsync(f.fileno())
