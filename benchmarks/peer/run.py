"""vlcache against vLLM's CPU build: the same checkpoint, prompts and images through both
engines, each in its own process, requests alternating between them round by round.

    .venv/bin/python benchmarks/peer/run.py --sizes 256,1024 --rounds 3 --name fixture
    .venv/bin/python benchmarks/peer/run.py --stub --name stub   # the loop, no model (seconds)

Writes docs/bench/peer-NAME.md (table), .png (plot), -samples.csv (every request), .json (meta)
and .log. `--resume` continues a stopped run from its CSV; `--render` redoes the report only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the `peer` package

from peer import driver as D  # noqa: E402
from peer import samples as S  # noqa: E402
from peer.cases import CASES, timed_request  # noqa: E402
from peer.schedule import pending, plan  # noqa: E402
from peer.stats import BASE, PEER  # noqa: E402

FIXTURE = Path.home() / ".cache/vlcache/fixture-qwen2_5_vl-0.5b"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=FIXTURE)
    p.add_argument("--sizes", default="256,1024,4096", help="image tokens per image")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--policy", default="static:0.05", help="vlcache's reuse policy")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="both engines' weights and activations")
    p.add_argument("--long-tokens", type=int, default=2048, help="text after the image (long)")
    p.add_argument("--name", default="fixture")
    p.add_argument("--out-dir", type=Path, default=D.REPO / "docs/bench")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/vlcache-peer"),
                   help="where a copy of the model with a raised pixel cap goes")
    p.add_argument("--vlcache-python", default=sys.executable)
    p.add_argument("--vllm-python", default=str(D.REPO / ".venv-vllm/bin/python"))
    p.add_argument("--kv-space", type=int, default=2, help="vLLM's KV pool, GiB")
    p.add_argument("--vllm-extra", default="{}", help="more LLM(...) arguments, JSON")
    p.add_argument("--vllm-preload", default="",
                   help="LD_PRELOAD for vLLM's process, e.g. tcmalloc as vLLM's CPU docs "
                        "recommend (/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4)")
    p.add_argument("--vlcache-preload", default="", help="LD_PRELOAD for vlcache's process")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per request")
    p.add_argument("--start-timeout", type=float, default=1800)
    p.add_argument("--resume", action="store_true", help="skip requests already in the CSV")
    p.add_argument("--retry-errors", action="store_true", help="with --resume: redo failures")
    p.add_argument("--render", action="store_true", help="only redo the report from the CSV")
    p.add_argument("--stub", action="store_true", help="stand-in engines (vLLM 2x slower)")
    return p.parse_args(argv)


def outputs(args: argparse.Namespace) -> dict[str, Path]:
    stem = f"peer-{args.name}"  # names may hold dots ("fixture-0.5b"): no with_suffix
    return {k: args.out_dir / f"{stem}{tail}" for k, tail in
            {"md": ".md", "png": ".png", "json": ".json", "log": ".log",
             "csv": "-samples.csv"}.items()}


def commands(args: argparse.Namespace, model: Path, sizes: list[int]
             ) -> dict[str, tuple[list[str], dict[str, str]]]:
    bench = D.REPO / "benchmarks"
    env = D.base_env()
    if args.stub:
        stub = [args.vlcache_python, "-m", "peer.stub_worker", "--name"]
        e = {**env, "PYTHONPATH": D.pythonpath(bench)}
        return {BASE: ([*stub, BASE, "--scale", "1"], e), PEER: ([*stub, PEER, "--scale", "2"], e)}
    vlcache = [args.vlcache_python, "-m", "peer.vlcache_worker", "--model", str(model),
               "--policy", args.policy, "--threads", "1", "--dtype", args.dtype]
    vllm = [args.vllm_python, "-m", "peer.vllm_worker", "--model", str(model),
            "--max-model-len", str(D.model_len(sizes, args.long_tokens)),
            "--dtype", args.dtype, "--extra", args.vllm_extra]
    vllm_env = {**env, "PYTHONPATH": D.pythonpath(bench), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_CPU_KVCACHE_SPACE": str(args.kv_space)}
    if args.vllm_preload:
        vllm_env["LD_PRELOAD"] = args.vllm_preload
    vlcache_env = {**env, "PYTHONPATH": D.pythonpath(D.REPO / "src", bench)}
    if args.vlcache_preload:
        vlcache_env["LD_PRELOAD"] = args.vlcache_preload
    return {BASE: (vlcache, vlcache_env), PEER: (vllm, vllm_env)}


def trimmer(model: Path, stub: bool):
    """Cuts the long text to an exact token count of the model's tokenizer."""
    if stub:
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return lambda text, n: tok.decode(tok(text, add_special_tokens=False)["input_ids"][:n])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = outputs(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    case_names = args.cases.split(",")
    meta = json.loads(out["json"].read_text()) if out["json"].exists() else {}
    if args.render:
        return D.finish(out, meta)
    if out["csv"].exists() and not args.resume:
        sys.exit(f"{out['csv']} exists: --resume to continue it, or remove it")
    done = {s.key for s in S.read(out["csv"]) if s.ok or not args.retry_errors}
    steps = pending(plan(sizes, args.rounds, case_names, [BASE, PEER]), done)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log = D.log_to(out["log"])
    model = args.model if args.stub else D.prepare_model(args.model, max(sizes), args.work_dir)
    if args.resume and meta.get("date"):
        meta.setdefault("resumed", []).append(D.now())
    meta.setdefault("date", D.now())
    meta.update(D.machine(), rounds=args.rounds,
                model="stub engines" if args.stub else str(args.model),
                command=D.command_line(), cases=D.cases_meta(args.long_tokens),
                load={"start": round(os.getloadavg()[0], 2)})
    log(f"{len(steps)} requests to run; model {model}")
    with out["log"].open("a") as engine_log:
        workers, meta["engines"] = D.start_engines(commands(args, model, sizes), engine_log,
                                                   args.start_timeout, log)
        trim = trimmer(model, args.stub)
        try:
            notes = D.run(workers, steps, out["csv"], args.timeout,
                          lambda s: timed_request(s.case, s.size, s.round, args.long_tokens,
                                                  trim), log)
        finally:
            for w in workers.values():
                w.close()
    meta["notes"] = sorted(set(meta.get("notes", []) + notes))
    D.finish(out, meta)
    log(f"wrote {out['md']}")


if __name__ == "__main__":
    main()
