"""``swattn demo``: a tiny gpt-oss-style model served by a continuous-batching loop on
swattn's plan/run API, checked token for token against transformers' eager attention.

The model is gpt-oss's architecture scaled down (a real config with small sizes, random
weights): window and full layers alternating, attention sinks, GQA, a mixture of experts.
Requests arrive over time, several sharing a system prompt (prefix-cache hits); prompts are
prefilled in chunks within a token budget beside the running decodes; window layers free
their pages as they slide out of the window. The report: tokens, tokens/s, pages held
against a window-unaware cache, key tiles walked against an unbounded kernel, and whether
every request's tokens equal the eager model's greedy generation. ``--full-kv fp8-e4m3`` keeps
the full layers' cache in fp8 beside the window layers' (one plan per layer kind) and reports
the cache's bytes and how far fp8 moves the tokens.

On a machine without a CUDA GPU it runs under Triton's interpreter in fp32 (the embedded
default, well under two minutes); on a GPU it runs larger sizes (``--size gpu``) in bf16 and
also times transformers' eager and SDPA generation of the same requests in one padded batch.
"""

from __future__ import annotations

import os

from .sizes import FULL_KV, SIZES


def add_arguments(parser):
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="problem sizes (default: gpu on a CUDA GPU, else cpu)")
    parser.add_argument("--requests", type=int, default=None, help="number of requests")
    parser.add_argument("--seed", type=int, default=0, help="weights and requests")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the comparison with transformers' eager generation")
    parser.add_argument("--no-baselines", action="store_true",
                        help="on a GPU, skip timing transformers' eager and SDPA generation")
    parser.add_argument("--plot", metavar="FILE", default=None,
                        help="write a plot of the pages held per step to FILE (matplotlib)")
    parser.add_argument("--full-kv", choices=sorted(FULL_KV), default=None,
                        help="keep the full layers' KV cache in fp8 (scale 1), the window layers "
                             "in the model's dtype; the check then shows what fp8 changes and "
                             "does not decide the exit status")


def run(args):
    import torch
    if not torch.cuda.is_available():
        # Before any kernel module is imported: Triton reads this when it first sees a kernel.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .main import main
    return main(args)
