"""`vlcache profile`: measure S_l(r) on a proxy data set and write the plan for a budget."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from vlcache.commands.device import add_device_arguments, device_and_dtype


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by `profile` and `eval`: model, data set, case kinds, sizes."""
    from vlcache.workloads.cases import KINDS
    from vlcache.workloads.hard import KINDS as HARD_KINDS
    from vlcache.workloads.reading import KINDS as READING_KINDS

    p.add_argument("--model", required=True,
                   help="local checkpoint directory (or a text-only .gguf file)")
    p.add_argument("--data", default="synthetic",
                   help="synthetic | mme[:SUBSET,...] | random | reading[:SEED] | hard[:SEED] "
                        "(documents, for text-only models too) (default synthetic)")
    p.add_argument("--limit", type=int, default=48, help="examples to load (default 48)")
    p.add_argument("--kinds", default=None,
                   help=f"case kinds, taken in turn (default {','.join(KINDS)}; for reading "
                        f"{','.join(READING_KINDS)}; for hard {','.join(HARD_KINDS)})")
    p.add_argument("--max-image-tokens", type=int, default=256,
                   help="scale larger images down to about this many tokens (default 256)")
    p.add_argument("--mme-root", default=None, help="MME directory (default ../shared/eval/mme)")
    p.add_argument("--grid", type=float, default=0.05, help="ratio grid step Δ (default 0.05)")
    add_device_arguments(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def load_halves(args: argparse.Namespace):
    """(engine, planning-half cases, held-out-half cases, all examples) from the options."""
    from vlcache.engine import Engine
    from vlcache.workloads import hard, reading
    from vlcache.workloads.cases import KINDS, build_cases, split_examples
    from vlcache.workloads.datasets import load_examples

    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = device_and_dtype(args)
    engine = Engine.from_pretrained(args.model, dtype=dtype, device=device, packing=args.packing)
    examples = load_examples(args.data, args.limit, args.mme_root, args.max_image_tokens)
    documents = {"reading": reading, "hard": hard}.get(args.data.split(":")[0])
    build = documents.build_cases if documents else build_cases
    default = documents.KINDS if documents else KINDS
    kinds = tuple(k.strip() for k in (args.kinds or ",".join(default)).split(",") if k.strip())
    first, second = split_examples(examples)
    return engine, build(first, kinds), build(second, kinds), examples


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--budget", type=float, default=0.05,
                   help="mean recompute ratio over layers (default 0.05)")
    p.add_argument("--method", choices=["dp", "greedy", "depth"], default="dp",
                   help="dp (default): exact allocation over the layer sensitivities "
                        "S_l(r); greedy: the paper's greedy over S_l(r); depth: exact allocation "
                        "over the depth "
                        "profile (planner/depth.py: each token group recomputed through layers "
                        "0..d by the engine itself; measures only what --budget can use)")
    p.add_argument("--half", choices=["plan", "all"], default="all",
                   help="profile on the planning half only (as `eval` does) or on all examples")
    p.add_argument("--rule", choices=["first", "query"], default="first",
                   help="ranking rule the plan's per-layer counts are filled by (default first)")
    p.add_argument("--out", default="plan.json", help="plan file to write (default plan.json)")


def run(args: argparse.Namespace) -> int:
    from vlcache.models.loading import ModelLoadError
    from vlcache.planner.allocate import grid_levels
    from vlcache.planner.profile import make_plan, profile
    from vlcache.workloads.datasets import describe

    try:
        if not 0.0 <= args.budget <= 1.0:
            raise ValueError(f"budget must be a mean ratio in [0, 1], got {args.budget}")
        grid_levels(args.grid)
        engine, first, second, examples = load_halves(args)
        cases = first if args.half == "plan" else first + second
        described = describe(args.data, examples) | {
            "half": args.half, "kinds": args.kinds, "max_image_tokens": args.max_image_tokens}
        if args.method == "depth":
            return _depth(args, engine, cases, described)
        prof = profile(engine, cases, args.grid, described, rule=args.rule)
        plan = make_plan(prof, args.budget, args.method)
    except (ModelLoadError, ValueError) as e:
        print(f"vlcache profile: {e}", file=sys.stderr)
        return 2
    plan.save(Path(args.out))
    print(f"wrote {args.out}: budget {plan.budget:.4f} (target {args.budget:g}), "
          f"objective {plan.meta['objective']:.4g} ({args.method}); "
          f"naive {plan.meta['naive_objective']:.4g}")
    print("ratios: " + " ".join(f"{r:g}" for r in plan.ratios))
    return 0


def _depth(args: argparse.Namespace, engine, cases, described: dict) -> int:
    from vlcache.planner.depth import depth_plan, profile_depths

    prof = profile_depths(engine, cases, args.grid, args.budget, described)
    plan = depth_plan(prof, args.budget, engine.num_layers)
    plan.save(Path(args.out))
    print(f"wrote {args.out}: budget {plan.budget:.4f} (target {args.budget:g}), predicted "
          f"gain {plan.meta['predicted_gain']:.4g} over naive error {prof.naive:.4g} (depth)")
    print("depths per token group: " + " ".join(str(d) for d in plan.meta["depths"]))
    print("ratios: " + " ".join(f"{r:g}" for r in plan.ratios))
    return 0
