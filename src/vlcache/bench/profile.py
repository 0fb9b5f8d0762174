"""Where a hit's time goes: the engine's stage times and torch.profiler's operator table."""

from __future__ import annotations

import time
from pathlib import Path

from vlcache.bench.images import allow_tokens, synth_image, token_unit
from vlcache.bench.ttft import requests
from vlcache.engine import Engine
from vlcache.reuse.policy import Policy


def profile_case(engine: Engine, tokens: int, policy: Policy, path: Path, seed: int = 0,
                 header: str = "", rows: int = 30) -> None:
    """Profile one request of the sweep's hit prompt at `tokens` (the image cached if needed)."""
    from torch.profiler import ProfilerActivity, profile

    allow_tokens(engine.image_processor, tokens)
    cache, hit = requests(synth_image(tokens, token_unit(engine.image_processor), seed + tokens))
    if not all(engine.holds(im.key) for im in engine.prepare(cache).images):
        engine.generate(cache, policy="full", max_tokens=1)
    t = time.perf_counter()
    engine.prepare(hit)
    build_s = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        stats = engine.generate(hit, policy=policy, max_tokens=1).stats
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    other = stats.ttft_s - stats.vision_s - stats.load_s - stats.prefill_s
    lines = [header, "", f"case {policy.name} at N={tokens} (under the profiler: slower)",
             f"TTFT {stats.ttft_s:.3f} s = prefill {stats.prefill_s:.3f} + vision "
             f"{stats.vision_s:.3f} + store load {stats.load_s:.3f} + other {other:.3f} "
             f"(prompt build alone, timed separately: {build_s:.3f} s)",
             f"|C_l| per layer: {stats.computed_per_layer}", "", table]
    path.write_text("\n".join(lines) + "\n")
