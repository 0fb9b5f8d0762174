"""A whole sweep on the tiny model: the rows, the limit, and the files the report writes."""

from __future__ import annotations

import pytest

from vlcache.bench.report import (
    markdown_table,
    overhead_lines,
    plot,
    read_csv,
    read_samples,
    summarize,
    write_csv,
    write_samples,
)
from vlcache.bench.ttft import PREFIX_SAME, TRANSFORMERS, measure_size
from vlcache.cli import main
from vlcache.reuse.registry import parse_policy


@pytest.fixture(scope="module")
def tiny():
    import torch

    from vlcache.bench.models import random_engine

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield random_engine("tiny-qwen2_5_vl")
    torch.set_num_threads(before)


def test_sweep_rows_and_report(tiny, tmp_path):
    engine, info = tiny
    policies = {p: parse_policy(p) for p in ["full", "encoder", "naive", "static:1.0"]}
    result = measure_size(engine, 16, policies, repeat=1)
    assert {s.case for s in result.samples} == set(policies) | {TRANSFORMERS, PREFIX_SAME}
    assert len(result.samples) == len(policies) + 2
    layers, s = engine.adapter.num_layers, result.prompt_tokens
    text = s - 16
    # the entry: encoder output [N, H] and K, V [L, N, kvh, d] in fp32
    a = engine.adapter
    assert result.entry_bytes >= 16 * 4 * (a.hidden_size + 2 * layers * a.kv_heads * a.head_dim)
    rows = {r.case: r for r in summarize(result)}
    assert rows["full"].speedup == 1.0 and rows["full"].limit == 1.0
    assert rows["naive"].mean_computed == text  # only the text is computed on a hit
    assert rows["naive"].limit == pytest.approx(s / text)
    assert rows["static:1.0"].limit == 1.0
    assert rows["encoder"].vision_share == 0.0 and rows["full"].vision_share > 0.0
    assert rows[TRANSFORMERS].vision_share > 0.0 and rows[TRANSFORMERS].prefill_speedup is None

    csv_path = tmp_path / "t.csv"
    write_csv(list(rows.values()), csv_path)
    again = {r.case: r for r in read_csv(csv_path)}
    assert again["naive"].image_tokens == 16
    assert again["naive"].limit == pytest.approx(rows["naive"].limit, rel=1e-5)
    table = markdown_table(list(rows.values()), "Command: `x`.")
    assert table.startswith("Command: `x`.") and table.count("\n| 16 |") == len(rows)
    plot(list(rows.values()), info.describe(), tmp_path / "a.png", tmp_path / "b.png")
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0

    write_samples([result], tmp_path / "s.csv")
    (back,) = read_samples(tmp_path / "s.csv")
    assert (back.image_tokens, back.prompt_tokens, back.entry_bytes) == (
        16, result.prompt_tokens, result.entry_bytes)
    again = {r.case: r for r in summarize(back)}
    assert again["naive"].limit == rows["naive"].limit
    assert again["encoder"].ttft_s == pytest.approx(rows["encoder"].ttft_s, rel=1e-5)
    (line,) = overhead_lines([back])
    assert line.startswith("- N=16: TTFT static:1.0 ÷ encoder = ")
    assert (tmp_path / "a.png").stat().st_size > 0 and (tmp_path / "b.png").stat().st_size > 0


def test_cli_writes_csv_markdown_and_plots(tmp_path):
    out = tmp_path / "tiny-0.5b"
    code = main(["bench", "ttft", "--arch", "tiny-qwen2_5_vl", "--tokens", "16", "--repeat",
                 "1", "--threads", "1", "--policies", "full,naive,ramp:0.5", "--no-reference",
                 "--out", str(out)])
    assert code == 0
    md = (tmp_path / "tiny-0.5b.md").read_text()
    assert "vlcache bench ttft --arch tiny-qwen2_5_vl --tokens 16" in md
    assert "ramp:0.5" in md and "transformers" not in md.split("\n", 1)[1]
    for name in ["tiny-0.5b.csv", "tiny-0.5b-samples.csv", "tiny-0.5b-ttft.png",
                 "tiny-0.5b-speedup.png"]:
        assert (tmp_path / name).stat().st_size > 0
    (tmp_path / "tiny-0.5b.csv").unlink()
    assert main(["bench", "render", "--out", str(out)]) == 0
    assert (tmp_path / "tiny-0.5b.md").read_text() == md
    assert (tmp_path / "tiny-0.5b.csv").stat().st_size > 0
    assert main(["bench", "ttft", "--arch", "tiny-qwen2_5_vl", "--policies", "naive",
                 "--out", str(out)]) == 2  # every ratio is to full


def test_profile_writes_stage_times_and_operators(tiny, tmp_path):
    from vlcache.bench.profile import profile_case

    engine, _ = tiny
    path = tmp_path / "p.txt"
    profile_case(engine, 16, parse_policy("naive"), path, header="Command: `x`.")
    text = path.read_text()
    assert text.startswith("Command: `x`.") and "case naive at N=16" in text
    assert "prefill" in text and "aten::" in text
