"""The report: a markdown table of per-round ratios (median, min-max) per size and case, the
engines' versions and settings, the machine; and a plot of the same ratios."""

from __future__ import annotations

from pathlib import Path

from peer.cases import CASES
from peer.stats import BASE, PEER, Summary, core_share

CASE_NAMES = {"miss": "miss (fresh image)", "same": "same prompt",
              "moved": "moved (other system prompt, question first)",
              "swapped": "two images swapped", "long": "long text after the image"}

SHORT = {"miss": "miss", "same": "same prompt", "moved": "moved", "swapped": "2 images swapped",
         "long": "long text after"}


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def ratio_table(summaries: list[Summary]) -> list[str]:
    lines = [f"| image tokens | case | {PEER} / {BASE} (median) | min–max | rounds | "
             f"{BASE} s | {PEER} s | prompt tokens | {PEER} cached | {BASE} computed/layer | "
             "errors |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        span = "–" if s.span is None else f"{s.span[0]:.2f}–{s.span[1]:.2f}"
        prompt = {e: "–" if v is None else str(round(v)) for e, v in s.prompt_tokens.items()}
        prompt_cell = (prompt[BASE] if prompt[BASE] == prompt[PEER]
                       else f"{prompt[BASE]} / {prompt[PEER]}")
        median = fmt_ratio(s.median)
        if s.median is not None and s.median < 1:
            median = f"**{median}**"  # vlcache slower
        lines.append(
            f"| {s.size:,} | {CASE_NAMES.get(s.case, s.case)} | {median} | {span} | "
            f"{len(s.ratios)} | {fmt(s.seconds[BASE])} | {fmt(s.seconds[PEER])} | "
            f"{prompt_cell} | {fmt(s.cached_tokens[PEER], 0)} | "
            f"{fmt(s.computed_tokens[BASE], 0)} | {len(s.errors) or ''} |")
    return lines


def engine_table(engines: dict[str, dict]) -> list[str]:
    lines = ["| engine | version | torch | transformers | start-up | settings |",
             "|---|---|---|---|---|---|"]
    for name, info in engines.items():
        if info.get("error"):
            lines.append(f"| {name} | – | – | – | – | failed to start: {info['error']} |")
            continue
        settings = "; ".join(f"{k}: {v}" for k, v in info.get("settings", {}).items())
        lines.append(f"| {name} | {info.get('version')} | {info.get('torch')} | "
                     f"{info.get('transformers')} | {fmt(info.get('start_s'), 0)} s | "
                     f"{settings.replace('|', '/')} |")
    return lines


def share_lines(samples: list) -> list[str]:
    """How much of a core each engine got: on a shared machine the ratios are fair only if
    the two compute threads got similar shares."""
    out = []
    for engine in (BASE, PEER):
        share = core_share(samples, engine)
        if share["all"] is not None:
            out.append(f"- {engine}: busiest thread {fmt(share['top'])} CPU-s per wall second, "
                       f"all its threads {fmt(share['all'])} (medians over its requests)")
    return out


def render(summaries: list[Summary], meta: dict, samples: list | None = None) -> str:
    """The markdown page; `meta` holds the command, machine, engines and load."""
    load = meta.get("load", {})
    out = [f"# vlcache against {PEER} (CPU build): time to first token, side by side", "",
           f"Run {meta.get('date', '?')}, {meta.get('rounds', '?')} interleaved rounds. "
           f"Model: `{meta.get('model', '?')}`. Machine: {meta.get('cpu', '?')}, "
           f"{meta.get('cores', '?')} cores, avx512_bf16: {meta.get('avx512_bf16', '?')}; "
           f"1-minute load average during the run {fmt(load.get('min'), 1)}–"
           f"{fmt(load.get('max'), 1)} (median {fmt(load.get('median'), 1)}; "
           f"{fmt(load.get('start'), 1)} at the start).", "", "```bash",
           meta.get("command", "?"), "```", "",
           f"Ratio = {PEER} TTFT / {BASE} TTFT within one round (> 1: {BASE} faster; bold: "
           f"{BASE} slower), median and min–max over rounds. TTFT = wall time of one "
           "`max_tokens=1` request inside the engine's own process (images built before the "
           "clock starts, preprocessing included). `vLLM cached`: its prefix-cache hit in "
           "tokens; `vlcache computed/layer`: prompt tokens it ran through each layer, mean "
           "over layers.", "", *ratio_table(summaries), "", "## Engines", "",
           *engine_table(meta.get("engines", {})), ""]
    shares = share_lines(samples or [])
    if shares:
        out += ["CPU per wall second during the requests (1.00 = a whole core):", "", *shares,
                ""]
    out += ["## Cases", ""]
    out += [f"- **{CASE_NAMES[c]}**: {meta['cases'][c]}" for c in CASES
            if c in meta.get("cases", {})]
    errors = [e for s in summaries for e in s.errors]
    if errors:
        out += ["", "## Errors", "", "| image tokens | round | case | engine | error |",
                "|---|---|---|---|---|"]
        out += [f"| {e.size} | {e.round} | {e.case} | {e.engine} | "
                f"{e.error.replace('|', '/')[:200]} |" for e in errors]
    if meta.get("notes"):
        out += ["", "## Notes", "", *meta["notes"]]
    return "\n".join(out) + "\n"


def plot(summaries: list[Summary], path: Path, title: str = "") -> None:
    """Median ratio per case, one bar per size, min-max whiskers, log scale, a line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({s.size for s in summaries})
    cases = [c for c in CASES if any(s.case == c for s in summaries)]
    width = 0.8 / max(len(sizes), 1)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, size in enumerate(sizes):
        xs, ys, lo, hi = [], [], [], []
        for j, case in enumerate(cases):
            s = next((s for s in summaries if s.size == size and s.case == case), None)
            if s is None or s.median is None:
                continue
            xs.append(j + (i - (len(sizes) - 1) / 2) * width)
            ys.append(s.median)
            lo.append(s.median - s.span[0])
            hi.append(s.span[1] - s.median)
        bars = ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=f"{size:,} image tokens")
        ax.bar_label(bars, [f"{y:.2f}" for y in ys], fontsize=7, padding=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), [SHORT.get(c, c) for c in cases])
    ax.set_ylabel(f"{PEER} TTFT / {BASE} TTFT (>1: {BASE} faster)")
    ax.set_title(title or f"{BASE} vs {PEER}, per-round ratios: median, min–max")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
