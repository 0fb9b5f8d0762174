"""`vlcache eval`: every policy at every budget against a full recompute; table, CSV, plot.

The plan is profiled on one half of the examples and evaluated on both halves. Each segment's
(image's or document's) cache is built in another context than the evaluated prompt (see
vlcache.workloads.cases, vlcache.workloads.reading and vlcache.workloads.hard).

Resumable: each prompt's rows are appended to `--out`/rows.jsonl as it finishes; a rerun with
the same arguments (run.json's `signature`) skips the prompts done and reuses the profiled plan.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vlcache.commands.profile import add_data_arguments, load_halves

DEFAULT_POLICIES = "naive,prefix,static,epic,cacheblend,kvshare,vlcache"
DEFAULT_BUDGETS = "0.01,0.02,0.05,0.1,0.2"
# the arguments that decide the rows: a run resumes only where they are the same
SIGNATURE = ("model", "data", "limit", "kinds", "max_image_tokens", "mme_root", "grid", "dtype",
             "policies", "budgets", "profile", "profile_limit")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_data_arguments(p)
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="families swept over --budgets (static, epic, cacheblend, kvshare, "
                        "vlcache, vlcache-greedy, vlcache-depth, vlcache-query, query, oracle, "
                        "guard, cacheblend-check) and fixed policies (naive, prefix, encoder, "
                        f"cacheblend:0.15:1, vlcache:PLAN.json, ...); default {DEFAULT_POLICIES}")
    p.add_argument("--budgets", default=DEFAULT_BUDGETS,
                   help=f"target mean computed ratios (default {DEFAULT_BUDGETS})")
    p.add_argument("--profile", default=None,
                   help="take the sensitivity table from this plan file instead of profiling "
                        "the planning half")
    p.add_argument("--profile-limit", type=int, default=None,
                   help="profile on at most this many planning-half prompts (default: all)")
    p.add_argument("--shard", type=_shard, default=(0, 1), metavar="K/N",
                   help="evaluate every N-th prompt from the K-th (0-based) only, appending to "
                        "the same --out as the other shards (run N processes, K = 0..N-1, one "
                        "thread each; each resumes like a whole run)")
    p.add_argument("--backfill-signals", action="store_true",
                   help="do not evaluate: measure the guard signal of the query rows logged "
                        "before rows carried it (query arms only, into --out/signals.jsonl; "
                        "resumable, takes --shard), then rewrite the report")
    p.add_argument("--out", default="eval-out",
                   help="output directory; a run there with the same arguments is resumed")


def _arms(tokens: list[str], budgets: list[float], engine, mean_tokens: float, prof,
          depth_prof=None, query_prof=None, check_layers=None):
    from vlcache.eval.budget import FAMILIES, policy_at
    from vlcache.eval.runner import Arm
    from vlcache.reuse.registry import parse_policy

    arms, skipped = [], []
    for token in tokens:
        if token not in FAMILIES:
            arms.append(Arm(token.split(":")[0] if ":" not in token else token, None,
                            parse_policy(token)))
            continue
        for b in budgets:
            try:
                policy = policy_at(token, b, engine.num_layers, mean_tokens, prof,
                                   depth_prof, query_prof, check_layers)
            except ValueError as e:
                policy = None
                skipped.append(f"{token}@{b:g}: {e}")
            if policy is None:
                skipped.append(f"{token}@{b:g}: cannot spend this budget")
            else:
                arms.append(Arm(token, b, policy))
    return arms, skipped


def mean_segment_tokens(engine, cases) -> float:
    """The mean token count of the reusable segments (images, documents) of `cases`: what
    a fixed-count policy (epic:K) is sized by, per half, so that K spends the target share of
    that half's segment tokens (a fixed K spends K / mean N of them)."""
    counts = [seg.num_tokens for c in cases for seg in engine.prepare(c.messages).segments]
    if not counts:
        raise ValueError("no reusable segments (images or documents) in the examples")
    return sum(counts) / len(counts)


PROFILED = {"first": ({"vlcache", "vlcache-greedy"}, "plan.json"),
            "query": ({"vlcache-query"}, "plan-query.json")}


def _profile(args: argparse.Namespace, engine, first, examples, tokens, budgets, out: Path,
             resuming: bool = False, rule: str = "first"):
    """The sensitivity profile (measured with ranking `rule`) for the vlcache families: from
    --profile (first rule), or measured on the planning half (and its 5% plan saved beside the
    results; a resumed run reads it back); None if no family needs it."""
    from vlcache.plan import Plan
    from vlcache.planner.profile import load_profile, make_plan, profile
    from vlcache.workloads.datasets import describe

    families, name = PROFILED[rule]
    if args.profile and rule == "first":
        return load_profile(Plan.load(args.profile))
    if not families & set(tokens):
        return None
    if resuming and (out / name).is_file():
        return load_profile(Plan.load(out / name))
    described = describe(args.data, examples) | {"half": "plan", "kinds": args.kinds,
                                                  "profiled": args.profile_limit}
    prof = profile(engine, first[:args.profile_limit], args.grid, described, rule=rule)
    out.mkdir(parents=True, exist_ok=True)
    make_plan(prof, 0.05 if 0.05 in budgets else budgets[0]).save(out / name)
    return prof


def _depth_profile(args: argparse.Namespace, engine, first, examples, tokens, budgets,
                   out: Path):
    """The depth profile for the vlcache-depth family, measured on the planning half for the
    largest budget (its 5% plan saved beside the results); None if not asked for."""
    from vlcache.planner.depth import depth_plan, profile_depths
    from vlcache.workloads.datasets import describe

    if "vlcache-depth" not in tokens:
        return None
    described = describe(args.data, examples) | {"half": "plan", "kinds": args.kinds,
                                                  "profiled": args.profile_limit}
    prof = profile_depths(engine, first[:args.profile_limit], args.grid, max(budgets), described)
    out.mkdir(parents=True, exist_ok=True)
    budget = 0.05 if 0.05 in budgets else budgets[0]
    depth_plan(prof, budget, engine.num_layers).save(out / "plan-depth.json")
    return prof


def _check_layers(args: argparse.Namespace, engine, first, tokens, budgets, out: Path,
                  resuming: bool):
    """cacheblend-check's layer per budget, chosen on the planning half (saved beside the
    results as check-layer.json; a resumed run reads it back); None if not asked for."""
    from vlcache.eval import check_layer

    if "cacheblend-check" not in tokens:
        return None
    path = out / "check-layer.json"
    if resuming and path.is_file():
        return check_layer.load(path)
    choices = check_layer.choose(engine, first[:args.profile_limit], budgets)
    out.mkdir(parents=True, exist_ok=True)
    check_layer.save(choices, path)
    return choices


def _write(out: Path, rows, prof, budgets: list[float], title: str, run_info: dict) -> str:
    from vlcache.eval import report
    from vlcache.planner.profile import objectives

    out.mkdir(parents=True, exist_ok=True)
    report.write_csv([r.as_dict() for r in rows], out / "rows.csv")
    if prof is not None:
        report.write_csv(objectives(prof, budgets), out / "objectives.csv")
        report.plot_sensitivity(prof.ratios, prof.table, out / "sensitivity.png",
                                f"S_l(r) · {title} · {prof.cases} prompts")
    (out / "run.json").write_text(json.dumps(run_info, indent=2, default=str))
    return write_report(out, rows, budgets, title)


def write_report(out: Path, rows, budgets: list[float], title: str) -> str:
    """summary.csv, summary.md and agreement.png from the rows; returns the markdown."""
    from vlcache.eval import guard_sweep, report, signals

    summary = report.summarize(rows)
    report.write_csv(summary, out / "summary.csv")
    table = report.summary_markdown(rows, budgets)
    sweep = guard_sweep.markdown(rows, guard_sweep.signals_of(rows, signals.read(
        out / signals.FILE)))
    if sweep:
        table += "\n" + sweep
    (out / "summary.md").write_text(table)
    report.plot(summary, out / "agreement.png", title)
    return table


def _shard(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise argparse.ArgumentTypeError(f"--shard {text!r}: K/N with 0 <= K < N, e.g. 0/2")
    return int(k), int(n)


def title_of(args: dict) -> str:
    return f"{args['data']} · {Path(args['model']).name}"


def _resume_layer(arms) -> int | None:
    """The layer whose hidden state the cached entries must keep for the plans that start
    there (the eval caches every image afresh, so one engine setting serves every arm)."""
    starts = {getattr(getattr(a.policy, "plan", None), "start_layer", 0) for a in arms} - {0}
    if len(starts) > 1:
        raise ValueError(f"plans starting at different layers {sorted(starts)} cannot be "
                         "evaluated in one run (entries keep one layer's hidden state)")
    return starts.pop() if starts else None


def _resuming(out: Path, signature: dict) -> bool:
    """Whether `out` holds a run with these arguments (to resume); an error if it holds rows
    of a run with other arguments."""
    info = out / "run.json"
    earlier = json.loads(info.read_text()).get("signature") if info.is_file() else None
    if earlier == signature:
        return True
    log = out / "rows.jsonl"
    if log.is_file() and log.stat().st_size:
        changed = sorted(k for k in signature if (earlier or {}).get(k) != signature[k])
        raise ValueError(f"{out} holds rows of a run with other arguments ({', '.join(changed)}"
                         "); pass another --out, or remove it to start over")
    return False


def _backfill(args: argparse.Namespace, engine, halves, out: Path, budgets) -> int:
    from vlcache.eval.report import read_rows
    from vlcache.eval.signals import backfill

    log = out / "rows.jsonl"
    if not log.is_file():
        print(f"vlcache eval: {log} does not exist: nothing to backfill", file=sys.stderr)
        return 2
    try:
        ran = backfill(engine, halves, read_rows(log), out, shard=args.shard)
    except ValueError as e:
        print(f"vlcache eval: {e}", file=sys.stderr)
        return 2
    print(f"measured the guard signal of {ran} prompts into {out}/signals.jsonl")
    print(write_report(out, read_rows(log), budgets, title_of(vars(args))))
    return 0


def run(args: argparse.Namespace) -> int:
    from vlcache.eval.rowlog import RowLog
    from vlcache.eval.runner import Half, evaluate
    from vlcache.models.loading import ModelLoadError

    tokens = [t.strip() for t in args.policies.split(",") if t.strip()]
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    out = Path(args.out)
    signature = {k: getattr(args, k, None) for k in SIGNATURE}
    try:
        resuming = _resuming(out, signature)
        engine, first, second, examples = load_halves(args)
        prof = _profile(args, engine, first, examples, tokens, budgets, out, resuming)
        depth_prof = _depth_profile(args, engine, first, examples, tokens, budgets, out)
        query_prof = _profile(args, engine, first, examples, tokens, budgets, out, resuming,
                              rule="query")
        checks = _check_layers(args, engine, first, tokens, budgets, out, resuming)
        means = [mean_segment_tokens(engine, half) for half in (first, second)]
        plan_arms, skipped = _arms(tokens, budgets, engine, means[0], prof, depth_prof,
                                   query_prof, checks)
        held_arms, _ = _arms(tokens, budgets, engine, means[1], prof, depth_prof, query_prof,
                             checks)
        engine.capture_hidden_at = _resume_layer(plan_arms)
    except (ModelLoadError, ValueError) as e:
        print(f"vlcache eval: {e}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if args.backfill_signals:
        return _backfill(args, engine, [Half("plan", first, plan_arms),
                                        Half("heldout", second, held_arms)], out, budgets)
    info = {"signature": signature, "args": vars(args), "skipped": skipped,
            "cases": [len(first), len(second)], "arms": [len(plan_arms), len(held_arms)],
            "mean_segment_tokens": {"plan": means[0], "heldout": means[1]}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(info, indent=2, default=str))
    halves = [Half("plan", first, plan_arms), Half("heldout", second, held_arms)]
    rows = evaluate(engine, halves, RowLog(out / "rows.jsonl"), shard=args.shard)
    expected = sum(len(h.cases) for h in halves)
    finished = len({(r.split, r.case) for r in rows})
    if finished < expected:
        print(f"vlcache eval: {finished} of {expected} prompts finished (the other shards' "
              "are still running); the summary covers those", file=sys.stderr)
    print(_write(out, rows, prof, budgets, title_of(vars(args)), info))
    print(f"wrote {out}/: rows.jsonl, rows.csv, summary.csv, summary.md, agreement.png, "
          "run.json")
    return 0
