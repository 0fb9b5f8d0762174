"""Agreement with a full recompute of the same prompt (design §5), and task accuracy."""

from __future__ import annotations

import re

import torch


def kl_divergence(full: torch.Tensor, other: torch.Tensor) -> float:
    """KL(full ‖ other) of the next-token distributions, from logits [V]."""
    p = torch.log_softmax(full.double(), dim=-1)
    q = torch.log_softmax(other.double(), dim=-1)
    return float((p.exp() * (p - q)).sum().clamp_min(0.0))


def logits_mse(full: torch.Tensor, other: torch.Tensor) -> float:
    return float((full.double() - other.double()).pow(2).mean())


def top1_agrees(full: torch.Tensor, other: torch.Tensor) -> bool:
    return int(full.argmax()) == int(other.argmax())


def top_margin(logits: torch.Tensor) -> float:
    """p(top-1) − p(top-2) of a next-token distribution, from logits [V]: how far the greedy
    choice is from a tie (a small margin flips under any small perturbation)."""
    top = torch.softmax(logits.double(), dim=-1).topk(2).values
    return float(top[0] - top[1])


def answer_correct(text: str, answer: str | None) -> bool | None:
    """The first word of the answer equals the ground truth (case and punctuation ignored);
    None when there is no ground truth."""
    if answer is None:
        return None
    words = re.findall(r"[a-z0-9]+", text.lower())
    want = re.findall(r"[a-z0-9]+", answer.lower())
    return bool(words) and words[: len(want)] == want
