"""How well does the frozen LM read its image slots? Replace the tower's output by oracles.

For held-out-style fixture questions, the vision tower's merged tokens are swapped (by a forward
hook) for something built from the scene's ground truth, and the fixture's greedy answers are
scored as `vlcache fixture eval` scores them:

- `real`: the tower's own tokens (no swap);
- `words`: each token the LM's input embedding of what it shows, the mean of " <colour>" and
  " <kind>" on a shape, " <word>" on a word, " white" on the background (stage A's align target);
- `words-zero-bg`: the same with zero vectors on the background;
- `description`: the scene written out as text ("a red circle at x=.. y=..; the word "cat";"),
  its token embeddings in the first image slots, zeros elsewhere.

If the oracles score well, regressing the tower onto them (cheap, no LM) would be the way to a
better fixture; if not, only end-to-end training through the LM teaches it what the LM reads.

    python benchmarks/fixture_oracle_tokens.py --modes real,words,words-zero-bg,description -n 48
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from vlcache.fixture.evaluate import accuracy_by_type, answer
from vlcache.fixture.labels import CellLabels, cell_labels
from vlcache.fixture.report import load
from vlcache.workloads.synthetic import COLORS, QTYPES, SHAPES, WORDS, Example, make_example

MODES = ("real", "words", "words-zero-bg", "description")


class Oracle:
    def __init__(self, model, tokenizer) -> None:
        self.emb = model.get_input_embeddings().weight.detach().float()  # [V, 896]
        self.tokenizer = tokenizer
        table = lambda words: torch.stack([self._word(w) for w in ["white", *words]])  # noqa: E731
        self.colors, self.kinds, self.words = table(COLORS), table(SHAPES), table(WORDS)

    def _word(self, word: str) -> torch.Tensor:  # [896]: embedding of " word"'s first token
        return self.emb[self.tokenizer(" " + word, add_special_tokens=False).input_ids[0]]

    def tokens(self, mode: str, ex: Example, lab: CellLabels) -> torch.Tensor:  # [N, 896]
        n = lab.color.shape[0]
        if mode == "description":
            parts = [f"a {s.color} {s.kind} at x={int(s.cx)} y={int(s.cy)};"
                     for s in sorted(ex.shapes, key=lambda s: s.cx)]
            if ex.word:
                parts.append(f'the word "{ex.word}";')
            ids = self.tokenizer(" " + (" ".join(parts) or "nothing"),
                                 add_special_tokens=False).input_ids[:n]
            out = torch.zeros(n, self.emb.shape[1])
            out[: len(ids)] = self.emb[ids]
            return out
        out = (self.colors[lab.color] + self.kinds[lab.kind]) / 2
        if mode == "words-zero-bg":
            out[lab.color == 0] = 0
        return torch.where((lab.word > 0)[:, None], self.words[lab.word], out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path,
                   default=Path.home() / ".cache/vlcache/fixture-qwen2_5_vl-0.5b")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("-n", type=int, default=48)
    p.add_argument("--sides", default="112,336", help="image side range in pixels")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lo, hi = (int(x) for x in args.sides.split(","))
    model, tokenizer, processor = load(args.model)
    oracle = Oracle(model, tokenizer)
    current: dict[str, object] = {}

    def swap(module, inputs, kwargs, out):
        if current["mode"] != "real":
            ex, lab = current["example"], current["labels"]
            tokens = oracle.tokens(current["mode"], ex, lab)
            out.pooler_output = tokens.to(out.pooler_output.dtype)
        return out

    model.model.visual.register_forward_hook(swap, with_kwargs=True)
    examples = [make_example(20_000, i, sides=(lo, hi), qtype=QTYPES[i % len(QTYPES)])
                for i in range(args.n)]
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        current["mode"] = mode
        results = []
        for ex in examples:
            current["example"], current["labels"] = ex, cell_labels(ex)
            results.append(answer(model, tokenizer, processor, ex))
        acc = accuracy_by_type(results)
        print(f"{mode}: " + ", ".join(f"{k} {v:.0%}" for k, v in acc.items()))
        common = Counter(r.predicted.strip().lower() for r in results).most_common(3)
        print(f"  most common answers: {common}")


if __name__ == "__main__":
    main()
