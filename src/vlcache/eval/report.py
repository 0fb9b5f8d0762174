"""Evaluation rows -> per-(split, kind, policy, budget) summary with bootstrap 95% intervals,
CSV, markdown and a plot."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from vlcache.eval.bootstrap import interval
from vlcache.eval.runner import Row

SPLIT_TITLES = {"plan": "planning half (the plan was profiled here)",
                "heldout": "held-out half (not seen by the profiler)"}
METRICS = ("exact", "top1", "kl", "mse", "accuracy")
ALL = "all"  # the summary's kind for every kind together


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _with_interval(name: str, values: list[float]) -> dict:
    bounds = interval(values)
    return {name: _mean(values), f"{name}_lo": bounds and bounds[0],
            f"{name}_hi": bounds and bounds[1]}


def summarize(rows: list[Row]) -> list[dict]:
    """One record per (split, kind, family, budget), kind `all` first: means, with bootstrap
    95% intervals (over prompts) for exact@16, top-1 and accuracy."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r.split, ALL, r.family, r.budget)].append(r)
    for r in rows:
        groups[(r.split, r.kind, r.family, r.budget)].append(r)
    out = []
    for (split, kind, family, budget), rs in groups.items():
        tokens = sum(r.segment_tokens for r in rs)
        judged = [float(r.correct) for r in rs if r.correct is not None]
        names = sorted({r.policy for r in rs})
        out.append({
            "split": split, "kind": kind, "family": family, "budget": budget,
            "policy": names[0] if len(names) == 1 else f"{family} ({len(names)} settings)",
            "n": len(rs),
            "computed": sum(r.computed * r.segment_tokens for r in rs) / tokens if tokens else 1.0,
            **_with_interval("exact", [float(r.exact) for r in rs]),
            **_with_interval("top1", [float(r.top1) for r in rs]),
            "kl": _mean([r.kl for r in rs]),
            "mse": _mean([r.mse for r in rs]),
            **_with_interval("accuracy", judged),
            "escalated": _mean([float(r.escalated) for r in rs]),
            "seconds": _mean([r.seconds for r in rs]),
            "select_s": _mean([r.select_s for r in rs]),
        })
    return out


def write_csv(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def _ci(s: dict, metric: str) -> str:
    """'81.3 (74.0–87.3)': the percentage and its 95% interval."""
    if s.get(metric) is None:
        return "–"
    low, high = s.get(f"{metric}_lo"), s.get(f"{metric}_hi")
    if low is None or high is None:
        return f"{100 * s[metric]:.1f}"
    return f"{100 * s[metric]:.1f} ({100 * low:.1f}–{100 * high:.1f})"


def _order(s: dict) -> tuple:
    fixed = s["budget"] is None
    return (not fixed or s["family"] != "full", fixed, s["budget"] or 0.0, s["family"])


def markdown(summary: list[dict], budgets: list[float]) -> str:
    """Per split: a pivot of greedy exact match (95% interval) by budget, then the full table
    (every kind together); then, for the held-out half (or the only one), the pivot per kind."""
    parts = []
    splits = list(dict.fromkeys(s["split"] for s in summary))
    for split in splits:
        rows = sorted((s for s in summary if s["split"] == split and s.get("kind", ALL) == ALL),
                      key=_order)
        n = max(s["n"] for s in rows)
        parts.append(f"### {SPLIT_TITLES.get(split, split)}: {n} prompts\n")
        parts.append(_pivot(rows, budgets))
        parts.append(_computed_pivot(rows, budgets))
        parts.append("| policy | target | computed | exact@16 (95% CI) | top-1 (95% CI) "
                     "| KL(full‖p) | logits MSE | accuracy (95% CI) | escalated | s/prompt "
                     "| of which select |\n|---|---|---|---|---|---|---|---|---|---|---|")
        for s in rows:
            target = "–" if s["budget"] is None else _pct(s["budget"])
            parts.append(f"| {s['policy']} | {target} | {_pct(s['computed'])} | "
                         f"{_ci(s, 'exact')} | {_ci(s, 'top1')} | {_num(s['kl'])} | "
                         f"{_num(s['mse'])} | {_ci(s, 'accuracy')} | "
                         f"{_pct(s.get('escalated'))} | {_num(s.get('seconds'))} | "
                         f"{_num(s.get('select_s'))} |")
        parts.append("")
    split = "heldout" if "heldout" in splits else splits[-1]
    kinds = [k for k in dict.fromkeys(s.get("kind", ALL) for s in summary
                                      if s["split"] == split) if k != ALL]
    for kind in kinds if len(kinds) > 1 else []:
        rows = sorted((s for s in summary if s["split"] == split and s["kind"] == kind),
                      key=_order)
        n = max(s["n"] for s in rows)
        parts.append(f"### kind `{kind}`, {SPLIT_TITLES.get(split, split).split(' (')[0]}: "
                     f"{n} prompts\n")
        parts.append(_pivot(rows, budgets))
    return "\n".join(parts)


def by_kind(rows: list[Row], budget: float) -> str:
    """Greedy exact match per case kind, both halves together, for the arms at `budget` and
    the fixed policies."""
    picked = [r for r in rows if r.budget in (None, budget) and r.family != "full"]
    kinds = list(dict.fromkeys(r.kind for r in rows))
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in picked:
        groups[r.policy][r.kind].append(float(r.exact))
    lines = [f"| exact match at {_pct(budget)} | " + " | ".join(
        f"{k} (n={sum(r.kind == k and r.family == 'full' for r in rows)})" for k in kinds) + " |",
        "|---" * (len(kinds) + 1) + "|"]
    for policy, per in groups.items():
        lines.append(f"| {policy} | " + " | ".join(_pct(_mean(per.get(k, []))) for k in kinds)
                     + " |")
    return "\n".join(lines) + "\n"


def by_margin(rows: list[Row], budget: float, threshold: float = 0.2) -> str:
    """Greedy exact match at `budget` split by how decided full's own first token was
    (p(top-1) − p(top-2) below or above `threshold`), both halves together."""
    picked = [r for r in rows if r.budget in (None, budget) and r.family != "full"]
    cases = {(r.split, r.case): r.margin for r in rows if r.family == "full"}
    near = sum(m < threshold for m in cases.values())
    heads = (f"near ties, margin < {threshold:g} (n={near})",
             f"decided, margin ≥ {threshold:g} (n={len(cases) - near})")
    groups: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for r in picked:
        groups[r.policy][r.margin >= threshold].append(float(r.exact))
    lines = [f"| exact match at {_pct(budget)} | {heads[0]} | {heads[1]} |", "|---|---|---|"]
    for policy, (low, high) in groups.items():
        lines.append(f"| {policy} | {_pct(_mean(low))} | {_pct(_mean(high))} |")
    return "\n".join(lines) + "\n"


def by_full_correct(rows: list[Row], budget: float) -> str:
    """Greedy exact match at `budget` split by whether full's own answer is right (cases with a
    known answer only), both halves together: a policy that disagrees where full is wrong may
    be the one that is right. Empty if no case has a known answer."""
    picked = [r for r in rows if r.budget in (None, budget) and r.family != "full"]
    right = {(r.split, r.case): r.correct for r in rows
             if r.family == "full" and r.correct is not None}
    if not right:
        return ""
    n_right = sum(right.values())
    heads = (f"full right (n={n_right})", f"full wrong (n={len(right) - n_right})",
             "policy right where full is wrong")
    groups: dict[str, tuple[list[float], list[float], list[float]]] = defaultdict(
        lambda: ([], [], []))
    for r in picked:
        full_right = right.get((r.split, r.case))
        if full_right is None:
            continue
        g = groups[r.policy]
        g[0 if full_right else 1].append(float(r.exact))
        if not full_right:
            g[2].append(float(bool(r.correct)))
    lines = [f"| exact match at {_pct(budget)} | " + " | ".join(heads) + " |",
             "|---|---|---|---|"]
    for policy, (ok, wrong, fixed) in groups.items():
        lines.append(f"| {policy} | {_pct(_mean(ok))} | {_pct(_mean(wrong))} | "
                     f"{_pct(_mean(fixed))} |")
    return "\n".join(lines) + "\n"


def summary_markdown(rows: list[Row], budgets: list[float]) -> str:
    """summary.md: the per-split tables, then (when 5% was run) exact match at 5% by case kind,
    by full's first-token margin and by whether full was right."""
    table = markdown(summarize(rows), budgets)
    if 0.05 in budgets:
        table += "\n### by case kind (both halves)\n\n" + by_kind(rows, 0.05)
        table += ("\n### by full's first-token margin, p(top-1) − p(top-2) (both halves)\n\n"
                  + by_margin(rows, 0.05))
        correct = by_full_correct(rows, 0.05)
        if correct:
            table += "\n### by whether full's answer is right (both halves)\n\n" + correct
    return table


def read_rows(path: Path) -> list[Row]:
    """Rows back from a `rows.jsonl` or `rows.csv` written by `vlcache eval`."""
    if path.suffix == ".jsonl":
        rows = [Row.from_dict(json.loads(line)) for line in path.read_text().splitlines()
                if line.strip()]
        # the log holds prompts in the order they finished; the report's order (and so its
        # bootstrap draws) is that of `vlcache eval`'s own result: split by split, prompt by
        # prompt (a stable sort keeps each prompt's rows in their order)
        order = {split: i for i, split in enumerate(SPLIT_TITLES)}
        return sorted(rows, key=lambda r: (order.get(r.split, len(order)), r.split, r.case))

    def flag(s: str) -> bool | None:
        return None if s == "" else s == "True"

    with path.open(newline="") as f:
        return [Row(d["split"], int(d["case"]), d["kind"], d["source"], d["family"],
                    None if d["budget"] == "" else float(d["budget"]), d["policy"],
                    int(d["segment_tokens"]), float(d["computed"]), float(d["kl"]),
                    float(d["mse"]), d["top1"] == "True", d["exact"] == "True",
                    flag(d["correct"]), d["answer"], float(d.get("margin") or "nan"),
                    d.get("escalated") == "True", float(d.get("seconds") or 0.0),
                    float(d.get("select_s") or 0.0),
                    float(d["signal"]) if d.get("signal") else None)
                for d in csv.DictReader(f)]


def _pivot(rows: list[dict], budgets: list[float]) -> str:
    """Families by budget: exact@16 % (95% interval); then the measured computed share."""
    head = "| exact@16 % (95% CI) | " + " | ".join(_pct(b) for b in budgets) + " |"
    lines = [head, "|---" * (len(budgets) + 1) + "|"]
    families = list(dict.fromkeys(s["family"] for s in rows if s["budget"] is not None))
    for fam in families:
        cells = {s["budget"]: s for s in rows if s["family"] == fam}
        lines.append(f"| {fam} | " + " | ".join(
            _ci(cells[b], "exact") if b in cells else "n/a" for b in budgets) + " |")
    for s in rows:
        if s["budget"] is None and s["family"] != "full":
            lines.append(f"| {s['policy']} (computed {_pct(s['computed'])}) | "
                         + " | ".join(_ci(s, "exact") for _ in budgets) + " |")
    return "\n".join(lines) + "\n"


def _computed_pivot(rows: list[dict], budgets: list[float]) -> str:
    """Families by budget: the measured mean computed share of the segments' token-layers."""
    lines = ["| computed (measured) | " + " | ".join(_pct(b) for b in budgets) + " |",
             "|---" * (len(budgets) + 1) + "|"]
    for fam in dict.fromkeys(s["family"] for s in rows if s["budget"] is not None):
        cells = {s["budget"]: s for s in rows if s["family"] == fam}
        lines.append(f"| {fam} | " + " | ".join(
            _pct(cells[b]["computed"]) if b in cells else "n/a" for b in budgets) + " |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = [s for s in summary if s.get("kind", ALL) == ALL]
    splits = list(dict.fromkeys(s["split"] for s in summary))
    fig, axes = plt.subplots(3, len(splits), figsize=(6 * len(splits), 11), squeeze=False)
    names = {"exact": "greedy exact match", "top1": "top-1", "kl": "first-token KL(full ‖ p)"}
    for col, split in enumerate(splits):
        rows = [s for s in summary if s["split"] == split]
        for row, metric in enumerate(names):
            _panel(axes[row][col], rows, metric)
            axes[row][col].set_title(f"{SPLIT_TITLES.get(split, split).split(' (')[0]}: "
                                     f"{names[metric]}")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, rows: list[dict], metric: str) -> None:
    for fam in dict.fromkeys(s["family"] for s in rows if s["budget"] is not None):
        pts = sorted((s["computed"], s[metric], s.get(f"{metric}_lo"), s.get(f"{metric}_hi"))
                     for s in rows if s["family"] == fam and s["budget"] is not None)
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if all(p[2] is not None and p[3] is not None for p in pts):  # 95% intervals
            err = [[y - p[2] for y, p in zip(ys, pts, strict=True)],
                   [p[3] - y for y, p in zip(ys, pts, strict=True)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=fam)
        else:
            ax.plot(xs, ys, marker="o", label=fam)
    for s in rows:
        if s["budget"] is None and s["family"] in {"naive"}:
            ax.axhline(s[metric], linestyle="--", color="gray", label="naive (0%)")
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter, PercentFormatter

    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.xaxis.set_minor_formatter(NullFormatter())  # less than a decade: no crowded minor labels
    ax.set_xticks([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0])
    ax.set_xlabel("computed share of reused segment token-layers (measured)")
    ax.set_ylabel(metric)
    if metric == "kl":  # lower is better; spans decades
        ax.set_yscale("log")
    else:  # agreement: zoom in when every arm agrees often (differences of one prompt show)
        low = min((s.get(f"{metric}_lo") or s[metric] for s in rows if s[metric] is not None),
                  default=0.0)
        ax.set_ylim(max(0.0, math.floor((low - 0.05) * 20) / 20) - 0.01, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot_sensitivity(ratios: list[float], table, path: Path, title: str) -> None:
    """S_l(r): one curve per layer (log scale, coloured by depth) and a layer × ratio heatmap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    table = np.asarray(table, dtype=float)
    floor = max(float(table[table > 0].min()) if (table > 0).any() else 1e-12, 1e-12)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    cmap = plt.get_cmap("viridis")
    for layer, row in enumerate(table):
        left.plot(ratios, np.maximum(row, floor), color=cmap(layer / max(len(table) - 1, 1)),
                  label=f"layer {layer}" if layer % 4 == 0 or layer == len(table) - 1 else None)
    left.set_yscale("log")
    left.set_xlabel("r: share of the segments' tokens recomputed at layer l only")
    left.set_ylabel("S_l(r)")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7, ncol=2)
    image = right.imshow(np.log10(np.maximum(table, floor)), aspect="auto", origin="lower",
                         extent=(ratios[0], ratios[-1], -0.5, len(table) - 0.5), cmap="magma")
    right.set_xlabel("r")
    right.set_ylabel("layer l")
    fig.colorbar(image, ax=right, label="log10 S_l(r)")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
