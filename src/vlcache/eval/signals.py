"""signals.jsonl: the guard's signal of `query` rows measured before rows carried it.

An evaluation's rows record each query arm's guard signal (`Row.signal`); rows logged before that
field existed lack it. `backfill` reruns only those query arms (the segments cached in their
other contexts, then one `query:B` prefill per budget: no full run, no decoding) and appends
`{split, case, source, policy, signal}` records beside the rows, so `eval/guard_sweep.py` can
threshold them. Resumable and shardable like the evaluation itself (the same lock discipline).
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from vlcache.engine import Engine
from vlcache.eval.guard_sweep import Key
from vlcache.eval.rowlog import RowLog
from vlcache.eval.runner import MAX_TOKENS, Half, Row, run_signal, shard_prompts
from vlcache.workloads.cases import prime

FILE = "signals.jsonl"


def read(path: Path) -> dict[Key, float]:
    """The backfilled signals ({(split, case, policy): signal}); lines cut off are skipped."""
    if not path.is_file():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
            found[(d["split"], int(d["case"]), d["policy"])] = float(d["signal"])
        except (ValueError, KeyError, TypeError):
            continue
    return found


def missing(halves: list[Half], rows: list[Row], have: dict[Key, float],
            shard: tuple[int, int] = (0, 1)) -> list[tuple[Half, int]]:
    """Shard (k, n)'s prompts (as the evaluation splits them) that have a query row without a
    signal yet."""
    lacking = {(r.split, r.case) for r in rows if r.family == "query" and r.signal is None
               and (r.split, r.case, r.policy) not in have}
    return [(half, i) for half, i in shard_prompts(halves, shard)
            if (half.split, i) in lacking]


def backfill(engine: Engine, halves: list[Half], rows: list[Row], out: Path,
             shard: tuple[int, int] = (0, 1), progress: bool = True) -> int:
    """Measure the missing signals of this shard's prompts; returns how many prompts it ran."""
    path = out / FILE
    log = RowLog(path)  # its lock and appends (records are not rows: read with `read`)
    mine = missing(halves, rows, read(path), shard)
    sources = {(r.split, r.case): r.source for r in rows}
    for half, i in tqdm(mine, desc="signals", unit="prompt", disable=not progress):
        case = half.cases[i]
        if case.source != sources[(half.split, i)]:
            raise ValueError(f"prompt {half.split}/{i} is {case.source!r} here but "
                             f"{sources[(half.split, i)]!r} in the rows: other arguments?")
        prime(engine, case)
        records = []
        for arm in (a for a in half.arms if a.family == "query"):
            run = engine.prefill(case.messages, policy=arm.policy, max_new_tokens=MAX_TOKENS,
                                 store_entries=False)
            records.append({"split": half.split, "case": i, "source": case.source,
                            "policy": arm.policy.name, "signal": run_signal(run)})
        log.append(records)
    return len(mine)
