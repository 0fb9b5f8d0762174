"""`vlcache report DIR`: rewrite an evaluation's summary (summary.md, summary.csv,
agreement.png) from its rows (rows.jsonl, else rows.csv) and run.json, without loading a model;
for reports whose tables were added after the run, or to look at a run still in progress."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="a `vlcache eval --out` directory (with rows.jsonl or rows.csv, "
                               "and run.json)")


def run(args: argparse.Namespace) -> int:
    from vlcache.commands.evaluate import title_of, write_report
    from vlcache.eval.report import read_rows

    out = Path(args.dir)
    rows_file = next((out / n for n in ("rows.jsonl", "rows.csv") if (out / n).is_file()), None)
    missing = [n for n, ok in (("rows.jsonl or rows.csv", rows_file),
                               ("run.json", (out / "run.json").is_file())) if not ok]
    if missing:
        print(f"vlcache report: {out} has no {' or '.join(missing)} "
              "(it must be the --out directory of a `vlcache eval` run)", file=sys.stderr)
        return 2
    info = json.loads((out / "run.json").read_text())["args"]
    budgets = [float(b) for b in str(info["budgets"]).split(",") if b.strip()]
    rows = read_rows(rows_file)
    if not rows:
        print(f"vlcache report: {rows_file} holds no rows yet", file=sys.stderr)
        return 2
    print(write_report(out, rows, budgets, title_of(info)))
    print(f"rewrote {out}/: summary.csv, summary.md, agreement.png ({len(rows)} rows)")
    return 0
