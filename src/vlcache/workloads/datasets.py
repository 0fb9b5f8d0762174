"""Data sets for profiling and evaluation, named by a spec string.

- `synthetic`: seeded shapes/colours/words questions (vlcache.workloads.synthetic, the
  generator the fixture model was trained on), a seed no training used, all question types in
  turn;
- `mme` or `mme:SUBSET[,SUBSET...]`: the MME images and yes/no questions, read at run time from
  `--mme-root` or `$VLCACHE_MME_ROOT` (default `../shared/eval/mme`, beside the checkout; never
  copied into the repository), subsets interleaved;
- `random`: noise images with a generic question and no answer (for random-weight models);
- `reading` or `reading:SEED`: invented facts in 3–4 short documents and one question
  (vlcache.workloads.reading; documents instead of images, so text-only models can run it);
- `hard` or `hard:SEED`: hard cases over 2–6 documents of ~45–230 tokens
  (vlcache.workloads.hard): question before/between/after, reordered, look-alike, multi-hop,
  refer.

Large images are scaled down to at most `max_image_tokens` image tokens, to keep CPU runs short.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image

from vlcache.workloads.cases import Example
from vlcache.workloads.synthetic import QTYPES, make_example

DEFAULT_MME_ROOT = Path("../shared/eval/mme")
SYNTHETIC_SEED = 20_000  # not a training seed of the fixture
SYNTHETIC_SIDES = (224, 448)  # 64 to 256 image tokens


def mme_root(root: str | Path | None = None) -> Path:
    path = Path(root or os.environ.get("VLCACHE_MME_ROOT") or DEFAULT_MME_ROOT).expanduser()
    if not path.is_dir():
        raise ValueError(f"MME data not found at {path}; pass --mme-root (the shared "
                         "eval/mme directory)")
    return path


def fit_image(image: Image.Image, max_tokens: int | None, unit: int = 28) -> Image.Image:
    """Scale down (keeping the aspect) so the image has at most about `max_tokens` tokens."""
    if max_tokens is None:
        return image
    w, h = image.size
    limit = max_tokens * unit * unit
    if w * h <= limit:
        return image
    scale = math.sqrt(limit / (w * h))
    size = (max(unit, int(w * scale) // unit * unit), max(unit, int(h * scale) // unit * unit))
    return image.resize(size, Image.Resampling.BICUBIC)


def _mme(subsets: list[str], root: Path) -> list[list[Example]]:
    per_subset = []
    for name in subsets:
        folder = root / name
        if not folder.is_dir():
            known = ", ".join(sorted(p.name for p in root.iterdir() if p.is_dir()))
            raise ValueError(f"no MME subset {name!r} under {root} (known: {known})")
        items = []
        for txt in sorted(folder.glob("*.txt")):
            image_path = next((p for p in folder.glob(txt.stem + ".*") if p.suffix != ".txt"),
                              None)
            if image_path is None:
                continue
            for k, line in enumerate(txt.read_text().splitlines()):
                question, sep, answer = line.partition("\t")
                if sep:
                    source = f"mme/{name}/{image_path.name}"
                    items.append((image_path, question.strip(), answer.strip(), f"{source}#{k}",
                                  source))
        per_subset.append(items)
    return per_subset


def load_mme(subsets: list[str] | None, limit: int | None, root: str | Path | None,
             max_tokens: int | None) -> list[Example]:
    base = mme_root(root)
    names = subsets or sorted(p.name for p in base.iterdir() if p.is_dir())
    # take whole images (both questions) from each subset in turn
    chunks = [_pairs(items) for items in _mme(names, base)]
    order = [x for group in itertools.zip_longest(*chunks) for x in group if x is not None]
    flat = [item for pair in order for item in pair][:limit]
    opened: dict[Path, Image.Image] = {}
    examples = []
    for path, question, answer, source, group in flat:
        if path not in opened:
            with Image.open(path) as im:
                opened[path] = fit_image(im.convert("RGB"), max_tokens)
        examples.append(Example(opened[path], question, answer, source, group))
    return examples


def _pairs(items: list[tuple]) -> list[list[tuple]]:
    return [list(g) for _, g in itertools.groupby(items, key=lambda it: it[0])]


def load_synthetic(limit: int, max_tokens: int | None) -> list[Example]:
    examples = []
    for i in range(limit):
        ex = make_example(SYNTHETIC_SEED, i, level=1, sides=SYNTHETIC_SIDES,
                          qtype=QTYPES[i % len(QTYPES)])
        examples.append(Example(fit_image(ex.image, max_tokens), ex.question, ex.answer,
                                f"synthetic/{ex.qtype}/{i}", f"synthetic/{i}"))
    return examples


def load_random(limit: int, seed: int = 0) -> list[Example]:
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(limit):
        w, h = (int(x) * 28 for x in rng.integers(3, 7, 2))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        examples.append(Example(Image.fromarray(pixels), "What is in the picture?", None,
                                f"random/{i}", f"random/{i}"))
    return examples


def load_examples(spec: str, limit: int = 48, mme: str | Path | None = None,
                  max_tokens: int | None = 256) -> list:
    """Examples for `synthetic`, `mme[:SUBSET,...]` or `random`, at most `limit` of them."""
    name, _, arg = spec.strip().partition(":")
    if name == "synthetic" and not arg:
        return load_synthetic(limit, max_tokens)
    if name == "mme":
        return load_mme(arg.split(",") if arg else None, limit, mme, max_tokens)
    if name == "random" and not arg:
        return load_random(limit)
    if name == "reading":
        from vlcache.workloads.reading import load_reading

        if arg and not arg.isdigit():
            raise ValueError(f"reading takes an integer seed, got {arg!r}")
        return load_reading(limit, int(arg) if arg else 7)
    if name == "hard":
        from vlcache.workloads.hard import DEFAULT_SEED, load_hard

        if arg and not arg.isdigit():
            raise ValueError(f"hard takes an integer seed, got {arg!r}")
        return load_hard(limit, int(arg) if arg else DEFAULT_SEED)
    raise ValueError(f"unknown data set {spec!r}: expected synthetic, mme[:SUBSET,...], random, "
                     "reading[:SEED] or hard[:SEED]")


def describe(spec: str, examples: list[Example]) -> dict:
    """What the plan file records about the data it was measured on."""
    return {"spec": spec, "examples": len(examples),
            "sources": [ex.source for ex in examples[:200]]}
