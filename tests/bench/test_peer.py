"""The peer benchmark's logic (benchmarks/peer) on stub engines, no vLLM: cases, interleaving,
ratios, the CSV, the report, and a whole run through real worker processes."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # the `peer` package

from peer import cases as C  # noqa: E402
from peer import driver as D  # noqa: E402
from peer import samples as S  # noqa: E402
from peer.images import grid_for, materialize, noise_image  # noqa: E402
from peer.protocol import Worker, cpu_used, thread_times  # noqa: E402
from peer.report import plot, render  # noqa: E402
from peer.schedule import Step, pending, plan, rotate  # noqa: E402
from peer.stats import core_share, round_ratios, summarize  # noqa: E402

_spec = importlib.util.spec_from_file_location("peer_run", BENCH / "peer" / "run.py")
peer_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_run)


def image_seeds(messages: list[dict]) -> list[int]:
    return [p["seed"] for m in messages if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image"]


def system(messages: list[dict]) -> str:
    return messages[0]["content"]


# --- cases --------------------------------------------------------------------------------------

def test_same_is_the_setup_prompt_and_the_rest_are_not():
    (_, cache), (_, pair) = C.setup_requests(256)
    a, b = image_seeds(pair)
    assert image_seeds(cache) == [a] and a != b
    assert C.timed_request("same", 256, 3) == cache
    for case in ("miss", "moved", "swapped", "long"):
        assert C.timed_request(case, 256, 0, long_tokens=10) != cache


def test_cases_put_the_images_where_they_should():
    (_, cache), (_, pair) = C.setup_requests(1024)
    a, b = image_seeds(pair)
    miss = C.timed_request("miss", 1024, 2)
    assert image_seeds(miss) not in ([a], [b]) and system(miss) == system(cache)
    moved = C.timed_request("moved", 1024, 2)
    assert image_seeds(moved) == [a] and system(moved) != system(cache)
    assert moved[1]["content"][0]["type"] == "text"  # the question comes before the image
    swapped = C.timed_request("swapped", 1024, 2)
    assert image_seeds(swapped) == [b, a] and C.images_in(swapped) == 2
    long = C.timed_request("long", 1024, 2, long_tokens=50)
    assert image_seeds(long) == [a] and long[:1] == cache[:1]  # image A where it was cached
    assert len(long[1]["content"][1]["text"].split()) > 50
    with pytest.raises(ValueError):
        C.timed_request("nope", 256, 0)


def test_what_varies_by_round_comes_before_the_cached_image():
    # a prefix cache must not serve round r from round r-1's request
    for case in ("miss", "moved", "swapped", "long"):
        r0, r1 = (C.timed_request(case, 256, r, long_tokens=20) for r in (0, 1))
        assert r0 != r1, case
    assert system(C.timed_request("moved", 256, 0)) != system(C.timed_request("moved", 256, 1))
    seeds = {image_seeds(C.timed_request("miss", n, r))[0] for n in (256, 1024) for r in range(5)}
    assert len(seeds) == 10
    assert not seeds & {C.seed_for(n, k) for n in (256, 1024) for k in "AB"}


def test_long_text_uses_the_trim_and_is_deterministic():
    assert C.long_text(1, 30) == C.long_text(1, 30) != C.long_text(2, 30)
    assert C.long_text(1, 30, trim=lambda t, n: t[:n]) == C.long_text(1, 30)[:30]
    text = C.timed_request("long", 256, 0, long_tokens=7, trim=lambda t, n: "X" * n)
    assert text[1]["content"][1]["text"].startswith("XXXXXXX\n")


def test_noise_images_have_the_token_grid_and_materialize_copies():
    assert grid_for(1024) == (32, 32) and grid_for(256) == (16, 16) and grid_for(6) == (2, 3)
    im = noise_image(6, seed=1)
    assert im.size == (3 * 28, 2 * 28)
    assert im.tobytes() == noise_image(6, seed=1).tobytes() != noise_image(6, 2).tobytes()
    spec = C.timed_request("swapped", 4, 0)
    out = materialize(spec, lambda pil: {"type": "image_pil", "image_pil": pil})
    parts = out[1]["content"]
    assert [p["type"] for p in parts] == ["image_pil", "image_pil", "text"]
    assert parts[0]["image_pil"].size == (56, 56)
    assert spec[1]["content"][0]["type"] == "image"  # the spec itself is untouched


# --- schedule -----------------------------------------------------------------------------------

def test_plan_alternates_engines_and_rotates_cases():
    cases, engines = ["miss", "same", "moved"], ["vlcache", "vLLM"]
    steps = plan([256, 1024], 3, cases, engines)
    assert len(steps) == len({s.key for s in steps}) == 2 * 3 * 3 * 2
    for i in range(0, len(steps), 2):  # the two engines back to back on the same request
        a, b = steps[i], steps[i + 1]
        assert (a.size, a.round, a.case) == (b.size, b.round, b.case) and a.engine != b.engine
    r = {k: [s for s in steps if s.size == 256 and s.round == k] for k in range(3)}
    assert [s.engine for s in r[0][:2]] == engines and [s.engine for s in r[1][:2]] == engines[::-1]
    assert [s.case for s in r[1][::2]] == ["same", "moved", "miss"]
    assert rotate(cases, 3) == cases and rotate([], 2) == []
    assert [s.size for s in steps] == sorted(s.size for s in steps)  # a size's rounds together


def test_pending_skips_done_steps_in_order():
    steps = plan([256], 2, ["miss", "same"], ["vlcache", "vLLM"])
    done = {steps[0].key, steps[3].key}
    left = pending(steps, done)
    assert left == [s for i, s in enumerate(steps) if i not in (0, 3)]


# --- ratios -------------------------------------------------------------------------------------

def sample(rnd, case, engine, t, size=256, **kw):
    return S.Sample(size, rnd, case, engine, ttft_s=t, **kw)


def test_ratios_are_vllm_over_vlcache_within_a_round():
    samples = [sample(0, "same", "vlcache", 1.0), sample(0, "same", "vLLM", 0.5),
               sample(1, "same", "vLLM", 3.0), sample(1, "same", "vlcache", 1.0),  # slow round
               sample(2, "same", "vlcache", 2.0), sample(2, "same", "vLLM", 4.0),
               sample(3, "same", "vlcache", 1.0),  # vLLM missing: no ratio
               sample(4, "same", "vlcache", 1.0), S.Sample(256, 4, "same", "vLLM", error="x"),
               sample(0, "same", "vLLM", 9.0, size=1024), sample(0, "miss", "vLLM", 9.0)]
    assert round_ratios(samples, 256, "same") == [0.5, 3.0, 2.0]
    [s] = [s for s in summarize(samples) if s.size == 256 and s.case == "same"]
    assert s.median == 2.0 and s.span == (0.5, 3.0)
    assert s.seconds == {"vlcache": 1.0, "vLLM": 3.0}  # medians of successful requests
    assert len(s.errors) == 1 and s.errors[0].error == "x"
    order = [(x.size, x.case) for x in summarize(samples)]
    assert order == [(256, "miss"), (256, "same"), (1024, "same")]
    assert [x.median for x in summarize(samples)][0] is None  # miss: one engine only


def test_an_even_number_of_rounds_takes_the_middle_mean():
    samples = [sample(r, "moved", e, t) for r, (a, b) in enumerate([(1, 2), (1, 4)])
               for e, t in (("vlcache", a), ("vLLM", b))]
    assert summarize(samples)[0].median == 3.0


def test_samples_round_trip_through_the_csv(tmp_path):
    path = tmp_path / "s.csv"
    rows = [sample(0, "miss", "vLLM", 1.25, prompt_tokens=300, cached_tokens=16.0, load1=2.5),
            S.Sample(1024, 2, "long", "vlcache", error="worker died, code 3", text="a,b\n")]
    for r in rows:
        S.append(path, r)
    back = S.read(path)
    assert back == rows and back[0].ok and not back[1].ok and back[1].ttft_s is None
    assert S.read(tmp_path / "none.csv") == []


def test_core_share_is_cpu_per_wall_second_of_each_engine():
    samples = [sample(0, "miss", "vlcache", 2.0, cpu_s=1.0, cpu_top_s=1.0),
               sample(1, "miss", "vlcache", 1.0, cpu_s=0.5, cpu_top_s=0.5),
               sample(0, "miss", "vLLM", 2.0, cpu_s=2.0, cpu_top_s=1.8),
               S.Sample(256, 1, "miss", "vLLM", cpu_s=9.0, error="failed")]  # not counted
    assert core_share(samples, "vlcache") == {"top": 0.5, "all": 0.5}
    assert core_share(samples, "vLLM") == {"top": pytest.approx(0.9), "all": 1.0}
    assert core_share(samples, "other") == {"top": None, "all": None}


def test_cpu_used_sums_threads_and_finds_the_busiest():
    before = {(1, 1): 10.0, (1, 2): 5.0}
    after = {(1, 1): 12.5, (1, 2): 5.25, (2, 7): 0.25}  # (2, 7): a thread born meanwhile
    assert cpu_used(before, after) == (3.0, 2.5)
    assert cpu_used({}, {}) == (0.0, 0.0)
    mine = thread_times()
    assert mine and all(t >= 0 for t in mine.values())


# --- report -------------------------------------------------------------------------------------

def meta(**kw):
    return {"date": "d", "rounds": 2, "model": "m", "cpu": "Xeon", "cores": 2,
            "avx512_bf16": "yes", "command": "python run.py --x", "load": {"start": 1.0},
            "cases": D.cases_meta(2048),
            "engines": {"vlcache": {"version": "0.1", "settings": {"policy": "static:0.05"}},
                        "vLLM": {"error": "did not start"}}, **kw}


def test_report_marks_losses_and_lists_errors():
    samples = [sample(0, "same", "vlcache", 1.0, prompt_tokens=284),
               sample(0, "same", "vLLM", 0.5, prompt_tokens=284),
               sample(0, "moved", "vlcache", 1.0, prompt_tokens=290),
               sample(0, "moved", "vLLM", 3.0, prompt_tokens=291),
               S.Sample(256, 0, "swapped", "vLLM", error="boom | bad")]
    samples[0].cpu_s, samples[0].cpu_top_s = 0.5, 0.25
    md = render(summarize(samples), meta(), samples)
    assert "- vlcache: busiest thread 0.25 CPU-s per wall second, all its threads 0.50" in md
    same = next(line for line in md.splitlines() if "| same prompt |" in line)
    moved = next(line for line in md.splitlines() if "| moved" in line)
    assert "**0.50×**" in same and "| 284 |" in same
    assert "| 3.00× |" in moved and "**" not in moved and "290 / 291" in moved
    assert "## Errors" in md and "boom / bad" in md
    assert "failed to start: did not start" in md and "python run.py --x" in md
    assert "avx512_bf16: yes" in md and "~2048 tokens" in md


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    samples = [sample(r, c, e, t) for r in range(2) for c in ("miss", "same")
               for e, t in (("vlcache", 1.0 + r), ("vLLM", 2.0))]
    plot(summarize(samples), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# --- the run ------------------------------------------------------------------------------------

def test_prepare_model_raises_the_pixel_cap_in_a_copy(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "preprocessor_config.json").write_text(json.dumps(
        {"patch_size": 14, "merge_size": 2, "size": {"longest_edge": 802816}}))
    (src / "model.safetensors").write_text("weights")
    assert D.prepare_model(src, 1024, tmp_path / "work") == src
    dst = D.prepare_model(src, 4096, tmp_path / "work")
    assert dst != src and (dst / "model.safetensors").is_symlink()
    cap = json.loads((dst / "preprocessor_config.json").read_text())["size"]["longest_edge"]
    assert cap == 4096 * 28 * 28
    assert json.loads((src / "preprocessor_config.json").read_text())["size"]["longest_edge"] \
        == 802816
    assert D.model_len([256, 1024], 2048) == 4096 and D.model_len([4096], 2048) == 9216


def stub(name: str, *flags: str) -> Worker:
    env = {**D.base_env(), "PYTHONPATH": str(BENCH)}
    return Worker(name, [sys.executable, "-m", "peer.stub_worker", "--name", name, *flags],
                  env, sys.stderr)


def test_a_failing_case_and_a_dying_engine_are_recorded_and_the_run_goes_on(tmp_path):
    engines = {"vlcache": stub("vlcache", "--fail-case", "moved"),
               "vLLM": stub("vLLM", "--scale", "3", "--die-after", "4")}
    for w in engines.values():
        w.wait_ready(60)
    steps = plan([4], 2, ["miss", "moved"], list(engines))
    path = tmp_path / "s.csv"
    try:
        D.run(engines, steps, path, 60, lambda s: C.timed_request(s.case, s.size, s.round),
              log=lambda line: None)
    finally:
        for w in engines.values():
            w.close()
    rows = S.read(path)
    assert [r.key for r in rows] == [s.key for s in steps]  # every step has its row
    by = {r.key: r for r in rows}
    assert "stub refuses moved" in by[(4, 0, "moved", "vlcache")].error
    # vLLM: 2 set-up requests and round 0, then it exits; later steps say why
    assert by[(4, 0, "moved", "vLLM")].ok
    assert "exited with code 3" in by[(4, 1, "moved", "vLLM")].error
    assert "exited with code 3" in by[(4, 1, "miss", "vLLM")].error
    assert round_ratios(rows, 4, "miss") == [pytest.approx(3.0)]


def test_stub_run_end_to_end_then_resume(tmp_path):
    argv = ["--stub", "--sizes", "4,16", "--rounds", "2", "--name", "t.1", "--out-dir",
            str(tmp_path), "--long-tokens", "20"]
    peer_run.main(argv)
    rows = S.read(tmp_path / "peer-t.1-samples.csv")
    assert len(rows) == 2 * 2 * len(C.CASES) * 2 and all(r.ok for r in rows)
    summaries = summarize(rows)
    assert all(s.median == pytest.approx(2.0) and len(s.ratios) == 2 for s in summaries)
    md = (tmp_path / "peer-t.1.md").read_text()
    assert "| 16 | two images swapped | 2.00× | 2.00–2.00 | 2 |" in md
    assert (tmp_path / "peer-t.1.png").exists() and (tmp_path / "peer-t.1.json").exists()
    with pytest.raises(SystemExit):  # no silent overwrite
        peer_run.main(argv)
    peer_run.main([*argv, "--resume"])  # nothing left: no new rows
    assert len(S.read(tmp_path / "peer-t.1-samples.csv")) == len(rows)
    peer_run.main([*argv, "--render"])
    assert (tmp_path / "peer-t.1.md").read_text().count("| 2.00× |") == 2 * len(C.CASES)


def test_step_keys_match_sample_keys():
    assert Step(256, 1, "miss", "vLLM").key == S.Sample(256, 1, "miss", "vLLM").key


def test_a_hung_worker_is_killed_with_its_children():
    psutil = pytest.importorskip("psutil")
    from peer.protocol import WorkerError

    code = ("import json, subprocess, sys, time\n"
            "child = subprocess.Popen(['sleep', '600'])\n"
            "print(json.dumps({'child': child.pid}), flush=True)\n"
            "time.sleep(600)\n")
    w = Worker("hung", [sys.executable, "-c", code], D.base_env(), sys.stderr)
    child = w.wait_ready(30)["child"]
    start = time.monotonic()
    with pytest.raises(WorkerError, match="no answer within"):
        w.call({"op": "generate"}, timeout=0.5)
    assert not w.alive and time.monotonic() - start < 10
    gone, deadline = False, time.monotonic() + 10  # SIGKILL lands asynchronously
    while not gone and time.monotonic() < deadline:
        try:
            gone = psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        time.sleep(0.05)
    if not gone:
        psutil.Process(child).kill()
    assert gone
    with pytest.raises(WorkerError, match="no answer within"):  # later calls say why
        w.call({"op": "generate"}, timeout=5)
