"""Run every policy on every case against a full recompute of the same prompt."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tqdm import tqdm

from vlcache.engine import Engine
from vlcache.engine.engine import PrefillRun
from vlcache.eval import metrics
from vlcache.reuse.policy import Policy
from vlcache.reuse.registry import parse_policy
from vlcache.workloads.cases import Case, prime

MAX_TOKENS = 16


@dataclass(frozen=True)
class Arm:
    """One policy setting to evaluate: its family, the budget it targets (None: fixed)."""

    family: str
    budget: float | None
    policy: Policy


@dataclass
class Row:
    split: str
    case: int
    kind: str
    source: str
    family: str
    budget: float | None  # target; None for fixed policies
    policy: str
    segment_tokens: int  # tokens of the reusable segments (images and documents)
    computed: float  # share of the segments' token-layers computed (1 = full)
    kl: float
    mse: float
    top1: bool
    exact: bool  # greedy answer (first MAX_TOKENS tokens) identical to full's
    correct: bool | None
    answer: str
    margin: float  # full's first-token p(top-1) − p(top-2), the same for every arm of a case

    def as_dict(self) -> dict:
        return asdict(self)


def greedy(engine: Engine, run: PrefillRun, max_tokens: int = MAX_TOKENS,
           reference: list[int] | None = None, after_divergence: int = 4) -> list[int]:
    """Greedy continuation of a prefilled request (Engine.decode_greedy)."""
    return engine.decode_greedy(run, max_tokens, reference, after_divergence)


def segment_tokens(run: PrefillRun) -> int:
    return sum(seg.num_tokens for seg in run.prompt.segments)


def _computed_share(run: PrefillRun) -> float:
    total = segment_tokens(run)
    reused = run.stats.image_tokens_reused + run.stats.text_tokens_reused
    return 1.0 - reused / total if total else 1.0


def evaluate_case(engine: Engine, case: Case, arms: list[Arm], split: str,
                  index: int) -> list[Row]:
    prime(engine, case)
    runs = [Arm("full", None, parse_policy("full")), *arms]
    rows, ref, ref_tokens = [], None, None
    for arm in runs:
        run = engine.prefill(case.messages, policy=arm.policy, max_new_tokens=MAX_TOKENS,
                             store_entries=False)
        tokens = greedy(engine, run, reference=ref_tokens)
        if ref is None:
            ref, ref_tokens = run.output.logits, tokens
        text = engine.decode_text(tokens)
        rows.append(Row(
            split=split, case=index, kind=case.kind, source=case.source, family=arm.family,
            budget=arm.budget, policy=arm.policy.name, segment_tokens=segment_tokens(run),
            computed=_computed_share(run), kl=metrics.kl_divergence(ref, run.output.logits),
            mse=metrics.logits_mse(ref, run.output.logits),
            top1=metrics.top1_agrees(ref, run.output.logits), exact=tokens == ref_tokens,
            correct=metrics.answer_correct(text, case.answer), answer=text,
            margin=metrics.top_margin(ref)))
    return rows


def evaluate(engine: Engine, cases: list[Case], arms: list[Arm], split: str,
             progress: bool = True) -> list[Row]:
    rows: list[Row] = []
    for i, case in enumerate(tqdm(cases, desc=f"evaluating ({split})", unit="prompt",
                                  disable=not progress)):
        rows.extend(evaluate_case(engine, case, arms, split, i))
    return rows
