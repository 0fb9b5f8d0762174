"""From samples to a summary per (image size, case), and from there to CSV, markdown and plots."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from vlcache.bench.timing import (
    Measurement,
    Sample,
    compute_bound_limit,
    median,
    per_round_ratios,
)
from vlcache.bench.ttft import SizeResult

BASELINE = "full"


@dataclass
class Row:
    """One case at one image size. Ratios are baseline/case within a round, then the median."""

    image_tokens: int
    prompt_tokens: int
    case: str
    runs: int
    ttft_s: float  # median
    ttft_min_s: float
    ttft_max_s: float
    speedup: float | None  # TTFT of full / TTFT of this case
    speedup_min: float | None
    speedup_max: float | None
    prefill_speedup: float | None  # full's LLM prefill / this case's (vision and load excluded)
    vision_share: float | None  # of TTFT, median
    load_share: float | None
    prefill_share: float | None  # the rest is prompt building, embedding, positions, sampling
    mean_computed: float | None  # sum_l |C_l| / L
    limit: float | None  # compute-bound speed-up (N + T) / mean |C_l|
    of_limit: float | None  # speedup / limit
    prefill_of_limit: float | None
    peak_rss_mb: float | None  # whole process, highest over the runs
    rss_delta_mb: float | None  # added by the call over what was resident before it, median
    entry_bytes_per_token: float  # what the store holds per image token


def _share(samples: list[Sample], part: str) -> float | None:
    values = [getattr(s.m, part) / s.m.ttft_s for s in samples if getattr(s.m, part) is not None]
    return median(values)


def _mb(value: float | None) -> float | None:
    return None if value is None else value / 2**20


def summarize(result: SizeResult, baseline: str = BASELINE) -> list[Row]:
    rows = []
    cases = list(dict.fromkeys(s.case for s in result.samples))
    for case in cases:
        mine = [s for s in result.samples if s.case == case]
        ttft = [s.m.ttft_s for s in mine]
        ratios = per_round_ratios(result.samples, case, baseline)
        prefill = per_round_ratios(result.samples, case, baseline,
                                   key=lambda s: s.m.prefill_s or float("nan"))
        prefill = [r for r in prefill if r == r]  # drop cases without a prefill time
        computed = mine[0].m.computed_per_layer
        mean_c = sum(computed) / len(computed) if computed else None
        limit = compute_bound_limit(mine[0].m.prompt_tokens, computed) if computed else 1.0
        speedup, prefill_speedup = median(ratios), median(prefill)
        peaks = [s.peak_rss for s in mine if s.peak_rss is not None]
        deltas = [s.rss_delta for s in mine if s.rss_delta is not None]
        rows.append(Row(
            result.image_tokens, result.prompt_tokens, case, len(mine), median(ttft), min(ttft),
            max(ttft), speedup, min(ratios, default=None), max(ratios, default=None),
            prefill_speedup, _share(mine, "vision_s"), _share(mine, "load_s"),
            _share(mine, "prefill_s"), mean_c, limit,
            None if speedup is None else speedup / limit,
            None if prefill_speedup is None else prefill_speedup / limit,
            _mb(max(peaks, default=None)), _mb(median(deltas)),
            result.entry_bytes / result.image_tokens))
    return rows


def write_csv(rows: list[Row], path: Path) -> None:
    names = [f.name for f in dataclasses.fields(Row)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in dataclasses.asdict(row).items()})


def read_csv(path: Path) -> list[Row]:
    types = {f.name: f.type for f in dataclasses.fields(Row)}
    rows = []
    with path.open() as f:
        for record in csv.DictReader(f):
            rows.append(Row(**{k: _parse(v, types[k]) for k, v in record.items()}))
    return rows


SAMPLE_FIELDS = ["image_tokens", "prompt_tokens", "entry_bytes", "case", "round", "ttft_s",
                 "vision_s", "load_s", "prefill_s", "computed_per_layer", "peak_rss",
                 "rss_delta"]


def write_samples(results: Iterable[SizeResult], path: Path) -> None:
    """Every timed run, enough to redo the statistics (`read_samples`)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(SAMPLE_FIELDS)
        for res in results:
            for s in res.samples:
                writer.writerow([res.image_tokens, res.prompt_tokens, res.entry_bytes, s.case,
                                 s.round, _cell(s.m.ttft_s), _cell(s.m.vision_s),
                                 _cell(s.m.load_s), _cell(s.m.prefill_s),
                                 " ".join(map(str, s.m.computed_per_layer)), _cell(s.peak_rss),
                                 _cell(s.rss_delta)])


def read_samples(path: Path) -> list[SizeResult]:
    """The results `write_samples` wrote, one per image size, in file order."""
    results: dict[int, SizeResult] = {}
    with path.open() as f:
        for rec in csv.DictReader(f):
            n = int(rec["image_tokens"])
            res = results.setdefault(n, SizeResult(n, int(rec["prompt_tokens"]),
                                                   int(rec["entry_bytes"]), []))
            m = Measurement(
                ttft_s=float(rec["ttft_s"]), vision_s=_parse(rec["vision_s"], "float"),
                load_s=float(rec["load_s"] or 0.0), prefill_s=_parse(rec["prefill_s"], "float"),
                computed_per_layer=[int(x) for x in rec["computed_per_layer"].split()],
                prompt_tokens=res.prompt_tokens, image_tokens=n)
            res.samples.append(Sample(rec["case"], int(rec["round"]), m,
                                      _parse(rec["peak_rss"], "int"),
                                      _parse(rec["rss_delta"], "int")))
    return list(results.values())


def paired(result: SizeResult, case: str, other: str) -> tuple[float, float, float] | None:
    """TTFT of `case` over `other`, per round: (median, min, max); None if either is missing."""
    ratios = per_round_ratios(result.samples, other, case)  # case/other
    return (median(ratios), min(ratios), max(ratios)) if ratios else None


def overhead_lines(results: list[SizeResult], case: str = "static:1.0",
                   other: str = "encoder") -> list[str]:
    """A line per size on what the reuse machinery costs when it recomputes everything."""
    lines = []
    for res in results:
        p = paired(res, case, other)
        if p is not None:
            lines.append(f"- N={res.image_tokens}: TTFT {case} ÷ {other} = {p[0]:.3f} "
                         f"(per-round min–max {p[1]:.3f}–{p[2]:.3f})")
    return lines


def _cell(v: object) -> object:
    if v is None:
        return ""
    return f"{v:.6g}" if isinstance(v, float) else v


def _parse(text: str, kind: str) -> object:
    if text == "":
        return None
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("str"):
        return text
    return float(text)


def _x(v: float | None, lo: float | None = None, hi: float | None = None) -> str:
    if v is None:
        return ""
    text = f"{v:.2f}×" if v < 10 else f"{v:.1f}×"
    return text + (f" ({lo:.2f}–{hi:.2f})" if lo is not None and hi is not None else "")


def _pct(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


HEADER = ("| N | N+T | case | TTFT s (min–max) | × full, per round (min–max) | prefill × | "
          "vision | load | prefill | mean C_l | limit | of limit (TTFT / prefill) | peak RSS MB | "
          "Δ RSS MB |")


def markdown_table(rows: list[Row], caption: str, notes: list[str] | None = None) -> str:
    lines = [caption, "", HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r.image_tokens} | {r.prompt_tokens} | {r.case} | {r.ttft_s:.3f} "
            f"({r.ttft_min_s:.3f}–{r.ttft_max_s:.3f}) | "
            f"{_x(r.speedup, r.speedup_min, r.speedup_max)} | {_x(r.prefill_speedup)} | "
            f"{_pct(r.vision_share)} | {_pct(r.load_share)} | {_pct(r.prefill_share)} | "
            f"{_num(r.mean_computed, '.1f')} | "
            f"{_x(r.limit)} | {_pct(r.of_limit)} / {_pct(r.prefill_of_limit)} | "
            f"{_num(r.peak_rss_mb, '.0f')} | {_num(r.rss_delta_mb, '.0f')} |")
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def _by_case(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in sorted(rows, key=lambda r: r.image_tokens):
        out.setdefault(r.case, []).append(r)
    return out


def _style(ax, title: str, sizes: list[int]) -> None:
    ax.set_title(title, fontsize=8)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()


def plot(rows: list[Row], title: str, ttft_path: Path, speedup_path: Path) -> None:
    """TTFT vs image tokens per case (log-log); speed-up vs tokens with each case's limit."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = "\n".join(textwrap.wrap(title, 80))
    sizes = sorted({r.image_tokens for r in rows})

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for case, rs in _by_case(rows).items():
        ax.plot([r.image_tokens for r in rs], [r.ttft_s for r in rs], marker="o", label=case)
    ax.set(xscale="log", yscale="log", xlabel="image tokens N", ylabel="TTFT (s, median)")
    _style(ax, title, sizes)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(ttft_path, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for case, rs in _by_case(rows).items():
        if case == BASELINE or all(r.speedup is None for r in rs):
            continue
        x = [r.image_tokens for r in rs]
        line, = ax.plot(x, [r.speedup for r in rs], marker="o", label=case)
        if any((r.limit or 1.0) > 1.0 for r in rs):
            ax.plot(x, [r.limit for r in rs], ls="--", color=line.get_color(), alpha=0.6,
                    label=f"{case} limit")
    ax.set(xscale="log", yscale="log", xlabel="image tokens N", ylabel="TTFT speed-up vs full")
    _style(ax, title, sizes)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(speedup_path, dpi=120)
    plt.close(fig)
