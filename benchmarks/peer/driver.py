"""The run: start both engines, cache each size's images in both, then time the cases in
interleaved rounds, one CSV row per request as it ends, and render the report."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from peer import cases as C
from peer import samples as S
from peer.protocol import Worker, WorkerError
from peer.report import plot, render
from peer.schedule import Step
from peer.stats import BASE, PEER, summarize

REPO = Path(__file__).resolve().parents[2]


def machine() -> dict:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     subprocess.run(["lscpu"], capture_output=True, text=True).stdout
                     .splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        model = "?"
    return {"cpu": model, "cores": os.cpu_count(),
            "avx512_bf16": "yes" if "avx512_bf16" in flags.split() else "no"}


def prepare_model(src: Path, tokens: int, work: Path) -> Path:
    """`src`, or a copy in `work` (weights linked) whose image processor keeps images of
    `tokens` tokens unresized: both engines load it, so the pixel cap is raised alike."""
    config = json.loads((src / "preprocessor_config.json").read_text())
    unit = int(config.get("patch_size", 14)) * int(config.get("merge_size", 2))
    need = tokens * unit * unit
    size = config.setdefault("size", {})
    if size.get("longest_edge", 0) >= need and config.get("max_pixels", need) >= need:
        return src
    size["longest_edge"] = max(size.get("longest_edge", 0), need)
    if "max_pixels" in config:
        config["max_pixels"] = max(config["max_pixels"], need)
    dst = work / f"{src.name}-cap{tokens}"
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = dst / f.name
        if f.name != "preprocessor_config.json" and not link.exists():
            link.symlink_to(f.resolve())
    (dst / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
    return dst


def model_len(sizes: list[int], long_tokens: int, margin: int = 512) -> int:
    """Room for the longest prompt: two images (swapped) or one image and the long text."""
    need = max(max(2 * n, n + long_tokens) for n in sizes) + margin
    return -(-need // 1024) * 1024


def setup_size(engines: dict[str, Worker], size: int, timeout: float,
               log: Callable[[str], None]) -> list[str]:
    """Cache size's images in every live engine; returns notes on disagreements."""
    notes = []
    for name, messages in C.setup_requests(size):
        answers = {}
        for engine, w in engines.items():
            if not w.alive:
                continue
            try:
                answers[engine] = a = w.call({"op": "generate", "case": name,
                                              "messages": messages}, timeout)
            except WorkerError as e:
                log(f"  set-up {name} on {engine}: {e}")
                continue
            log(f"  set-up {size} {name} on {engine}: "
                + (f"{a['ttft_s']:.2f} s, {a['prompt_tokens']} tokens, answer {a['text']!r}"
                   if a["ok"] else f"failed: {a['error']}"))
        tokens = {e: a.get("prompt_tokens") for e, a in answers.items() if a["ok"]}
        if len(set(tokens.values())) > 1:
            notes.append(f"- {size} image tokens, set-up `{name}`: the engines count different "
                         f"prompt tokens: {tokens}.")
        for e, a in answers.items():
            if a["ok"] and a.get("image_tokens") not in (None, size * C.images_in(messages)):
                notes.append(f"- {size} image tokens, set-up `{name}`: {e} saw "
                             f"{a['image_tokens']} image tokens.")
    return notes


def run_step(w: Worker, step: Step, messages: list[dict], timeout: float) -> S.Sample:
    sample = S.Sample(step.size, step.round, step.case, step.engine)
    try:
        a = w.call({"op": "generate", "case": step.case, "messages": messages}, timeout)
    except WorkerError as e:
        a = {"ok": False, "error": str(e)}
    if a["ok"]:
        for k in ("ttft_s", "cpu_s", "cpu_top_s", "prompt_tokens", "cached_tokens",
                  "computed_tokens"):
            setattr(sample, k, a.get(k))
        sample.text = a.get("text", "")
    else:
        sample.error = a["error"]
    sample.load1 = round(os.getloadavg()[0], 2)
    sample.at = datetime.datetime.now().isoformat(timespec="seconds")
    return sample


def run(engines: dict[str, Worker], steps: list[Step], csv_path: Path, timeout: float,
        request: Callable[[Step], list[dict]], log: Callable[[str], None] = print) -> list[str]:
    """Every step in order, each size's set-up first; rows appended to `csv_path`."""
    notes: list[str] = []
    for size in dict.fromkeys(s.size for s in steps):
        notes += setup_size(engines, size, timeout, log)
        for step in (s for s in steps if s.size == size):
            sample = run_step(engines[step.engine], step, request(step), timeout)
            S.append(csv_path, sample)
            log(f"  {size:>5} r{step.round} {step.case:<8} {step.engine:<8} "
                + (f"{sample.ttft_s:7.2f} s  cached {sample.cached_tokens}"
                   if sample.ok else f"ERROR {sample.error}") + f"  load {sample.load1}")
    return notes


def load_stats(samples: list[S.Sample], start: float | None) -> dict:
    loads = [s.load1 for s in samples if s.load1 is not None]
    if not loads:
        return {"start": start}
    return {"start": start, "min": min(loads), "max": max(loads),
            "median": statistics.median(loads)}


def finish(out: dict[str, Path], meta: dict) -> None:
    """Render the markdown and plot from the CSV and the saved meta."""
    samples = S.read(out["csv"])
    meta["load"] = load_stats(samples, meta.get("load", {}).get("start"))
    summaries = summarize(samples)
    out["md"].write_text(render(summaries, meta, samples))
    if any(s.median is not None for s in summaries):
        plot(summaries, out["png"])
    out["json"].write_text(json.dumps(meta, indent=2))


def start_engines(commands: dict[str, tuple[list[str], dict[str, str]]], log_file,
                  timeout: float, log: Callable[[str], None]) -> tuple[dict[str, Worker], dict]:
    """Start every engine at once (vLLM takes minutes), then wait for each to be ready."""
    workers = {n: Worker(n, argv, env, log_file) for n, (argv, env) in commands.items()}
    infos = {}
    for name, w in workers.items():
        try:
            infos[name] = w.wait_ready(timeout)
            log(f"{name} ready after {infos[name]['start_s']:.0f} s: {infos[name]}")
        except WorkerError as e:
            infos[name] = {"error": str(e)}
            log(f"{name} did not start: {e}")
    return workers, infos


def cases_meta(long_tokens: int) -> dict:
    return {c: d.format(long=long_tokens) for c, d in C.DESCRIPTIONS.items()}


def pythonpath(*parts: Path) -> str:
    return os.pathsep.join(str(p) for p in parts)


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def log_to(path: Path) -> Callable[[str], None]:
    def log(line: str) -> None:
        print(line, flush=True)
        with path.open("a") as f:
            f.write(f"{datetime.datetime.now().isoformat(timespec='seconds')} {line}\n")
    return log


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z")


def command_line() -> str:
    return " ".join([sys.executable, *sys.argv])


ENGINES = (BASE, PEER)
