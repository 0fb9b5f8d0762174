"""`--device` and `--dtype`, the same on every command that loads a model."""

from __future__ import annotations

import argparse

import torch

from vlcache.models.packing import PACKING_MODES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None,
                   help="cpu | cuda | cuda:N (default: cuda when a GPU is visible, else cpu)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                   help="weights and activations (default: bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--packing", choices=PACKING_MODES, default="auto",
                   help="decoder weights packed for oneDNN (CPU), 1.2-2x faster for a few rows "
                        "(a repeated prompt's tail, a moved image, decoding): dual also keeps "
                        "the plain weights for many rows (twice the decoder's weight memory), "
                        "packed does not; auto: dual for fp32, packed for bf16, off elsewhere")


def device_and_dtype(args: argparse.Namespace) -> tuple[str, torch.dtype]:
    """The device asked for (checked) or the default, and the dtype for it."""
    from vlcache.models.loading import check_device, default_device, default_dtype

    device = check_device(args.device or default_device())
    return device, DTYPES[args.dtype] if args.dtype else default_dtype(device)
