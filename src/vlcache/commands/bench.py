"""`vlcache bench`: TTFT side by side (`ttft`) and a load run against the server (`server`)."""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path

from vlcache.commands.device import add_device_arguments

DEFAULT_POLICIES = "full,encoder,prefix,naive,static:0.05,static:1.0,cacheblend,ramp:0.05"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", required=True)
    t = sub.add_parser("ttft", help="time-to-first-token per policy and image size",
                       description="TTFT per policy and image size, policies interleaved.")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="local checkpoint directory")
    src.add_argument("--arch", help="random-weight model of a known size (e.g. qwen2_5_vl-3b, "
                     "fixture-qwen2_5_vl-0.5b, tiny-qwen2_5_vl)")
    t.add_argument("--layers", type=int, default=None,
                   help="with --arch: run this many decoder layers (vision depth scaled alike)")
    t.add_argument("--tokens", default="256,1024,4096", help="image-token counts (comma list)")
    t.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma list; must include full. ramp:B is a monotone stand-in plan of "
                        f"mean B for random models (default {DEFAULT_POLICIES})")
    t.add_argument("--repeat", type=int, default=5,
                   help="interleaved rounds (default 5; 0 with --profile: profile only)")
    t.add_argument("--no-reference", action="store_true",
                   help="skip plain transformers generate")
    t.add_argument("--no-prefix-same", action="store_true",
                   help="skip prefix reuse of the identical prompt")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_device_arguments(t)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--profile", default=None, metavar="CASES",
                   help="after the rounds, profile one run of each case (comma list) at the "
                        "largest size")
    t.add_argument("--out", default=None,
                   help="output prefix (default docs/bench/ttft-<model>)")
    r = sub.add_parser("render", help="redo a ttft report's tables and plots from its samples",
                       description="Re-summarise PREFIX-samples.csv into PREFIX.csv, .md, .png; "
                                   "the caption is kept from PREFIX.md.")
    r.add_argument("--out", required=True, help="the prefix a `bench ttft` run wrote")
    s = sub.add_parser("server", help="bounded load run against `vlcache serve` on loopback")
    from vlcache.bench.server import add_arguments as add_server_arguments

    add_server_arguments(s)


def run(args: argparse.Namespace) -> int:
    if args.bench == "server":
        from vlcache.bench.server import run as run_server

        return run_server(args)
    if args.bench == "render":
        return _render(Path(args.out))
    try:
        return _ttft(args)
    except ValueError as e:
        print(f"vlcache bench ttft: {e}", file=sys.stderr)
        return 2


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPU cores ({cpu}), load average {load} (1/5/15 min) at start"


def _policies(spec: str, num_layers: int) -> dict:
    from vlcache.bench.plans import ramp_plan
    from vlcache.reuse.policy import RatioPolicy
    from vlcache.reuse.registry import parse_policy

    out = {}
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name.startswith("ramp:"):
            out[name] = RatioPolicy(ramp_plan(float(name[5:]), num_layers), name=name)
        else:
            out[name] = parse_policy(name)
    if "full" not in out:
        raise ValueError("--policies must include full (every ratio is to full)")
    return out


def _ttft(args: argparse.Namespace) -> int:
    import torch

    from vlcache.bench import models, report
    from vlcache.bench.ttft import measure_size
    from vlcache.commands.device import device_and_dtype

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.layers is not None and not args.arch:
        raise ValueError("--layers needs --arch")
    if args.repeat < 0 or (args.repeat == 0 and not args.profile):
        raise ValueError("--repeat must be positive (or 0 with --profile)")
    tokens = [int(x) for x in args.tokens.split(",") if x.strip()]
    command = _command(args)
    where = machine()
    device, dtype = device_and_dtype(args)
    if args.arch:
        engine, info = models.random_engine(args.arch, args.layers, args.seed, dtype,
                                            device=device, packing=args.packing)
    else:
        engine, info = models.checkpoint_engine(args.model, dtype, device=device,
                                                packing=args.packing)
    policies = _policies(args.policies, engine.num_layers)
    out = Path(args.out or f"docs/bench/ttft-{info.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    caption = (f"Command: `{command}`. Model: {info.describe()}. Machine: {where}; "
               f"torch threads {torch.get_num_threads()}. Prompt text: T = N+T − N tokens; "
               f"the hit puts the cached image at new positions.")
    print(caption, flush=True)
    results, rows = [], []
    for n in tokens if args.repeat > 0 else []:  # --repeat 0: only the profile
        started = time.perf_counter()
        res = measure_size(engine, n, policies, args.repeat, not args.no_reference,
                           not args.no_prefix_same, args.seed, on_sample=_progress(n))
        results.append(res)
        rows += report.summarize(res)
        report.write_samples(results, Path(f"{out}-samples.csv"))
        _write(out, rows, results, caption, info.describe())
        print(f"N={n}: {time.perf_counter() - started:.0f} s", flush=True)
    if rows:
        print(report.markdown_table(rows, caption, report.overhead_lines(results)))
    for case in (c.strip() for c in (args.profile or "").split(",") if c.strip()):
        from vlcache.bench.profile import profile_case

        path = Path(f"{out}-profile-{re.sub(r'[^A-Za-z0-9._-]+', '_', case)}.txt")
        policy = policies.get(case) or _policies(f"full,{case}", engine.num_layers)[case]
        profile_case(engine, max(tokens), policy, path, args.seed, header=caption)
        print(f"wrote {path}")
    return 0


def _write(out: Path, rows: list, results: list, caption: str, title: str) -> None:
    from vlcache.bench import report

    report.write_csv(rows, Path(f"{out}.csv"))
    notes = report.overhead_lines(results)
    Path(f"{out}.md").write_text(report.markdown_table(rows, caption, notes))
    report.plot(rows, title, Path(f"{out}-ttft.png"), Path(f"{out}-speedup.png"))


def _render(out: Path) -> int:
    from vlcache.bench import report

    results = report.read_samples(Path(f"{out}-samples.csv"))
    caption = Path(f"{out}.md").read_text().split("\n", 1)[0]
    title = caption.split("Model: ", 1)[-1].split(". Machine:", 1)[0]
    rows = [row for res in results for row in report.summarize(res)]
    _write(out, rows, results, caption, title)
    print(f"wrote {out}.csv, {out}.md and the plots from {len(results)} image sizes")
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (every option spelled out)."""
    words = ["vlcache", "bench", "ttft"]
    words += ["--arch", args.arch] if args.arch else ["--model", args.model]
    if args.layers is not None:
        words += ["--layers", str(args.layers)]
    words += ["--tokens", args.tokens, "--policies", args.policies, "--repeat", str(args.repeat)]
    if args.threads:
        words += ["--threads", str(args.threads)]
    words += ["--device", args.device] if args.device else []
    words += ["--dtype", args.dtype] if args.dtype else []
    words += ["--seed", str(args.seed)]
    words += ["--no-reference"] * args.no_reference + ["--no-prefix-same"] * args.no_prefix_same
    if args.profile:
        words += ["--profile", args.profile]
    if args.out:
        words += ["--out", args.out]
    return shlex.join(words)


def _progress(n: int):
    def show(sample) -> None:
        print(f"N={n} round {sample.round} {sample.case:>14}: {sample.m.ttft_s:8.3f} s",
              flush=True)

    return show
