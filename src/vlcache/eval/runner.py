"""Run every policy on every case against a full recompute of the same prompt.

Per prompt: its segments are cached in their other contexts, then ONE full run (its greedy answer
is the reference; its captured KV feeds the oracle arms), then every arm, whose agreement with
full's answer is decided teacher-forced (eval/agreement.py), in one pass for all arms. Guard
arms share work with their base arms and with each other (`_Guards`). With a row log
(eval/rowlog.py), each prompt's rows are appended as it finishes and a rerun skips the prompts
already done.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, fields

from tqdm import tqdm

from vlcache.engine import Engine
from vlcache.engine.engine import PrefillRun
from vlcache.eval import metrics
from vlcache.eval.agreement import Agreement, agree_all
from vlcache.eval.rowlog import RowLog
from vlcache.reuse.guard import GuardPolicy, guard_signal
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
    escalated: bool = False  # guard: recomputed every reused token after its base pass
    seconds: float = 0.0  # the arm's cost as if run alone: its prefill (relevance pass
    # included; a guard's shared base run and recompute counted in each guard that shares them)
    # and an equal share of the prompt's agreement pass; full: caching the segments in their
    # other contexts, its prefill and greedy decoding
    select_s: float = 0.0  # of which the relevance pass (query, guard)
    signal: float | None = None  # the guard's signal on this run's output (reuse/guard.py):
    # set where a relevance pass gave naive's logits and nothing escalated (query arms, and
    # guards that stopped at their base); what `eval/guard_sweep.py` thresholds

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Row:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass
class Half:
    """One half of the examples: its cases and the arms sized for it."""

    split: str
    cases: list[Case]
    arms: list[Arm]


def greedy(engine: Engine, run: PrefillRun, max_tokens: int = MAX_TOKENS) -> list[int]:
    """Greedy continuation of a prefilled request (stops at an end-of-turn token)."""
    return engine.decode_greedy(run, max_tokens)


def segment_tokens(run: PrefillRun) -> int:
    return sum(seg.num_tokens for seg in run.prompt.segments)


def _computed_share(run: PrefillRun, policy: Policy) -> float:
    """Share of the segments' token-layers computed; an escalated guard also spent its base
    pass (every segment is a hit in the evaluation: each was cached before)."""
    total = segment_tokens(run)
    if not total:
        return 1.0
    reused = run.stats.image_tokens_reused + run.stats.text_tokens_reused
    share = 1.0 - reused / total
    if run.stats.escalated and isinstance(policy, GuardPolicy):
        layers = len(run.stats.computed_per_layer)
        base = sum(sum(policy.base.schedule(seg.num_tokens, layers).counts) / layers
                   for seg in run.prompt.segments)
        share += base / total
    return share


def _needs_reference(policy: Policy) -> bool:
    return getattr(policy, "rule", None) == "oracle"


def answer_words(answer: str | None) -> int:
    return len(re.findall(r"[a-z0-9]+", answer.lower())) if answer else 0


def evaluate_case(engine: Engine, case: Case, arms: list[Arm], split: str,
                  index: int) -> list[Row]:
    """The full run's row, then one row per arm."""
    start = time.perf_counter()
    prime(engine, case)
    full = engine.prefill(case.messages, policy="full", max_new_tokens=MAX_TOKENS,
                          store_entries=False, capture=True)
    reference = greedy(engine, full)
    exact_kv = {seg.key: full.output.captured[i] for i, seg in enumerate(full.prompt.segments)
                if i in full.output.captured}
    rows = [_row(case, split, index, Arm("full", None, parse_policy("full")), full,
                 Agreement(True, reference), full, time.perf_counter() - start, engine)]
    runs: dict[str, tuple[PrefillRun, float]] = {}  # policy name -> (run, its prefill time)
    guards = _Guards()
    for arm in sorted(arms, key=lambda a: isinstance(a.policy, GuardPolicy)):  # guards last
        shared = guards.share(arm.policy, runs)
        if shared is not None:
            runs[arm.policy.name] = shared
            continue
        start = time.perf_counter()
        run = engine.prefill(case.messages, policy=arm.policy, max_new_tokens=MAX_TOKENS,
                             store_entries=False,
                             reference=exact_kv if _needs_reference(arm.policy) else None)
        runs[arm.policy.name] = run, time.perf_counter() - start
        guards.ran(arm.policy, runs)
    unique = list({id(run): run for run, _ in runs.values()}.values())
    start = time.perf_counter()
    verdicts = agree_all(engine, unique, reference, MAX_TOKENS, answer_words(case.answer))
    agreements = {id(run): v for run, v in zip(unique, verdicts, strict=True)}
    share = (time.perf_counter() - start) / max(len(arms), 1)
    for arm in arms:
        run, seconds = runs[arm.policy.name]
        rows.append(_row(case, split, index, arm, run, agreements[id(run)], full,
                         seconds + share, engine))
    return rows


class _Guards:
    """Work a guard arm shares with others of the prompt. Unescalated, a guard computes exactly
    its base policy (query:R): where that arm ran, the guard's own decision on its output (its
    logits, and the naive logits of its relevance pass) says whether the guard stops there; if
    so, that run (and time) is the guard's. Escalated, every guard recomputes all reused tokens
    whatever R, so one escalated run serves all of them (its time: their base run's plus the
    recompute's)."""

    def __init__(self) -> None:
        self.escalated: tuple[PrefillRun, float] | None = None  # (run, time of its recompute)

    def share(self, policy: Policy, runs: dict[str, tuple[PrefillRun, float]]
              ) -> tuple[PrefillRun, float] | None:
        """The guard's (run, time) from work done, or None: it must run."""
        if not isinstance(policy, GuardPolicy) or policy.base.name not in runs:
            return None
        base, seconds = runs[policy.base.name]
        if not policy.escalate(base.output.logits, base.output.naive_logits):
            return base, seconds
        if self.escalated is None:
            return None
        run, recompute = self.escalated
        return run, seconds + recompute

    def ran(self, policy: Policy, runs: dict[str, tuple[PrefillRun, float]]) -> None:
        run, seconds = runs[policy.name]
        if isinstance(policy, GuardPolicy) and run.stats.escalated and policy.base.name in runs:
            base = runs[policy.base.name][1]
            self.escalated = run, max(seconds - base, 0.0)
            # this guard's time as the others sharing its run count theirs (its base's time
            # plus the recompute), so a noisy clock cannot make it cheaper than its base
            runs[policy.name] = run, base + self.escalated[1]


def _row(case: Case, split: str, index: int, arm: Arm, run: PrefillRun, agreement: Agreement,
         full: PrefillRun, seconds: float, engine: Engine) -> Row:
    ref = full.output.logits
    text = engine.decode_text(agreement.tokens)
    return Row(
        split=split, case=index, kind=case.kind, source=case.source, family=arm.family,
        budget=arm.budget, policy=arm.policy.name, segment_tokens=segment_tokens(run),
        computed=_computed_share(run, arm.policy),
        kl=metrics.kl_divergence(ref, run.output.logits),
        mse=metrics.logits_mse(ref, run.output.logits),
        top1=metrics.top1_agrees(ref, run.output.logits), exact=agreement.exact,
        correct=metrics.answer_correct(text, case.answer), answer=text,
        margin=metrics.top_margin(ref), escalated=run.stats.escalated, seconds=seconds,
        select_s=run.stats.select_s, signal=run_signal(run))


def run_signal(run: PrefillRun) -> float | None:
    """The guard's signal on `run` (its logits against its relevance pass's naive logits), or
    None where no relevance pass ran or the run escalated (its logits are then full's)."""
    naive = run.output.naive_logits
    if naive is None or run.stats.escalated:
        return None
    return guard_signal(run.output.logits, naive)


def shard_prompts(halves: list[Half], shard: tuple[int, int] = (0, 1)
                  ) -> list[tuple[Half, int]]:
    """Shard (k, n)'s prompts: every n-th from the k-th, the halves taken in turn (prompt 0 of
    each, then 1, ...), so a run stopped part way has evaluated both, the held-out half
    included; the split is the same whatever the other shards have done."""
    order = sorted(((h, half, i) for h, half in enumerate(halves)
                    for i in range(len(half.cases))), key=lambda t: (t[2], t[0]))
    k, n = shard
    return [(half, i) for j, (_, half, i) in enumerate(order) if j % n == k]


def evaluate(engine: Engine, halves: list[Half], log: RowLog | None = None,
             progress: bool = True, shard: tuple[int, int] = (0, 1)) -> list[Row]:
    """Every case of every half, with its arms; with a `log`, the prompts it holds are skipped
    (their rows are read back) and each new prompt's rows are appended to it. `shard` (k, n):
    only every n-th prompt from the k-th (in the order below) is evaluated here, the others
    left to other processes sharing the log; the rows returned are those the log holds at the
    end (every prompt's once all shards are done)."""
    expected = {(half.split, i): (1 + len(half.arms), case.source)
                for half in halves for i, case in enumerate(half.cases)}
    done = ({key: [Row.from_dict(d) for d in rows] for key, rows in log.read(expected).items()}
            if log is not None else {})
    mine = shard_prompts(halves, shard)
    todo = [(half, i) for half, i in mine if (half.split, i) not in done]
    total = len(mine)
    with tqdm(total=total, initial=total - len(todo), desc="evaluating", unit="prompt",
              disable=not progress, smoothing=0.1) as bar:
        for half, i in todo:
            rows = evaluate_case(engine, half.cases[i], half.arms, half.split, i)
            if log is not None:
                log.append([row.as_dict() for row in rows])
            done[(half.split, i)] = rows
            bar.update()
    if log is not None and shard[1] > 1:  # the other shards' prompts finished so far
        done = {key: [Row.from_dict(d) for d in rows]
                for key, rows in log.read(expected).items()}
    return [row for half in halves for i in range(len(half.cases))
            for row in done.get((half.split, i), [])]
