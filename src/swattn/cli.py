"""The ``swattn`` command.

Subcommands live in one registry, :data:`COMMANDS`; adding one is one ``register`` line:

- arguments here, implementation imported when the command runs:
  ``register(Command("tiles", help, add_arguments, lazy("swattn.x:run")))``;
- a module with ``add_arguments(parser)`` and ``run(args) -> int`` (standard library only
  at its top level): ``register(from_module("verify", help, "swattn.verify.cli"))``;
- a module whose ``main(argv, prog) -> int`` parses its own arguments (``prog``: the
  command as the user typed it, ``swattn bench``, for its usage lines):
  ``register(Command("bench", help, forward="swattn.bench.cli:main"))``.

Nothing heavy (torch, triton, even numpy) is imported until a command runs, so
``swattn --help`` and ``swattn tiles`` start at once. With no subcommand, ``swattn``
runs ``demo`` on its embedded default (``swattn prove`` proves the loop bounds).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_COMMAND = "demo"


@dataclass(frozen=True)
class Command:
    """One subcommand: ``run(args)`` returns the exit status. A ``forward`` command
    (``"module:function"``) instead gets the rest of the command line as ``main(argv,
    prog)``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    run: Callable[[argparse.Namespace], int] | None = None
    forward: str | None = None


COMMANDS: dict[str, Command] = {}


def register(command):
    if command.name in COMMANDS:
        raise ValueError(f"command {command.name!r} is already registered")
    if (command.forward is None) == (command.run is None):
        raise ValueError(f"command {command.name!r} needs exactly one of run and forward")
    COMMANDS[command.name] = command
    return command


def _load(target):
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def lazy(target):
    """``run`` for ``"package.module:function"``, imported only when the command runs."""
    return lambda args: _load(target)(args)


def from_module(name, help, module):
    """A command whose module defines ``add_arguments(parser)`` and ``run(args)``."""
    return Command(name, help, lambda parser: _load(f"{module}:add_arguments")(parser),
                   lazy(f"{module}:run"))


# --------------------------------------------------------------------------------------
# swattn prove
# --------------------------------------------------------------------------------------

def _add_prove_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.add_argument("--quick", action="store_true", help="a small grid (a couple of seconds)")
    parser.add_argument("--no-schedule", action="store_true",
                        help="prove the kernels' bounds only, not swattn.memory's free schedule")


register(from_module(
    "demo", "serve a tiny gpt-oss-style model through swattn's plan/run API, checked against "
    "transformers (the main job)", "swattn.demo"))

register(Command(
    "prove", "prove the key-tile bounds exhaustively against the mask, and the memory "
    "schedule against the bounds (exit 1 on a violation)",
    _add_prove_arguments, lazy("swattn.verify.prove:run")))


# --------------------------------------------------------------------------------------
# swattn tiles
# --------------------------------------------------------------------------------------

def _window_arg(text):
    if text.lower() in ("none", "full"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0 or 'none', got {text!r}")
    return value


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def _non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def _add_tiles_arguments(parser):
    shape = parser.add_argument_group("shape (one sequence, or --workload, or --decode)")
    shape.add_argument("--prefix", type=_non_negative, help="cached tokens before the new ones (P)")
    shape.add_argument("--extend", type=_non_negative, help="new tokens (E)")
    shape.add_argument("--workload", metavar="P:E,P:E,...",
                       help="a ragged batch of (prefix, extend) sequences, counts summed")
    shape.add_argument("--decode", metavar="S,S,...",
                       help="decode: keys and tiles read for these seq_lens (new token included)")
    window = parser.add_argument_group("window")
    window.add_argument("--window-left", type=_window_arg, default=None,
                        help="L: keys p-L..p are visible (gpt-oss: 127); 'none' = full (default)")
    window.add_argument("--window-right", type=_window_arg, default=None,
                        help="R, with --non-causal: keys up to p+R; 'none' = unbounded (default)")
    window.add_argument("--non-causal", action="store_true",
                        help="keys after the query are visible")
    window.add_argument("--attention-chunk", type=_positive, default=None, metavar="C",
                        help="chunked local attention: a query sees only the keys of its own "
                             "chunk of C positions (Llama 4: 8192), on top of the window")
    tiling = parser.add_argument_group("tiling and multipliers")
    tiling.add_argument("--block-m", type=_positive, default=128, help="query rows per block (128)")
    tiling.add_argument("--block-n", type=_positive, default=64, help="keys per tile (64)")
    tiling.add_argument("--batch", type=_positive, default=1, help="identical sequences (1)")
    tiling.add_argument("--heads", type=_positive, default=1, help="query heads (1)")
    parser.add_argument("--json", action="store_true",
                        help='print only {"stage1": {"all": n, "tight": n}, "stage2": ..., '
                             '"unified": ...}')


def _tiles_error(prog, message):
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _run_tiles(args):
    from . import tiles

    prog = args.prog
    causal = not args.non_causal
    if causal and args.window_right is not None:
        return _tiles_error(prog, "--window-right needs --non-causal "
                                  "(causal already ends at the query)")
    modes = [args.workload is not None, args.decode is not None,
             args.prefix is not None or args.extend is not None]
    if sum(modes) != 1:
        return _tiles_error(prog, "give --prefix and --extend, or --workload, or --decode")
    window_text = f"window_left {'none' if args.window_left is None else args.window_left}"
    if not causal:
        right = "none" if args.window_right is None else args.window_right
        window_text += f", window_right {right}, non-causal"
    else:
        window_text += ", causal"
    if args.attention_chunk is not None:
        window_text += f", attention_chunk {args.attention_chunk}"
    multipliers = f"batch {args.batch}, heads {args.heads}"
    try:
        if args.decode is not None:
            if not causal:
                return _tiles_error(prog, "--decode is causal: drop --non-causal")
            seq_lens = [int(s) for s in args.decode.split(",") if s.strip()]
            counts = tiles.count_decode(seq_lens, args.window_left, args.block_n,
                                        batch=args.batch, heads=args.heads,
                                        chunk=args.attention_chunk)
            title = (f"decode over {len(seq_lens)} seq_lens, {window_text}, BN {args.block_n}, "
                     f"{multipliers}")
            print(json.dumps(counts) if args.json else tiles.format_decode_table(counts, title))
            return 0
        if args.workload is not None:
            shapes = tiles.parse_workload(args.workload)
            what = f"workload of {len(shapes)} sequences"
        else:
            if args.prefix is None or args.extend is None:
                return _tiles_error(prog, "give both --prefix and --extend")
            shapes = [(args.prefix, args.extend)]
            what = f"prefix {args.prefix}, extend {args.extend}"
        count = functools.partial(tiles.count_workload, shapes, args.window_left,
                                  args.window_right, causal, args.block_m, args.block_n,
                                  batch=args.batch, heads=args.heads)
        counts = count(chunk=args.attention_chunk)
        unchunked = None
        if args.attention_chunk is not None and not args.json:
            unchunked = count()
    except ValueError as error:
        return _tiles_error(prog, str(error))
    if args.json:
        print(json.dumps(counts))
    else:
        title = (f"key tiles walked: {what}, {window_text}, BM {args.block_m}, BN {args.block_n}, "
                 f"{multipliers}")
        print(tiles.format_table(counts, title, unchunked))
    return 0


register(Command("tiles", "count the key tiles each loop walks (the performance model)",
                 _add_tiles_arguments, _run_tiles))
register(from_module("verify", "bit-identity matrix of the bounds variants, against the reference",
                     "swattn.verify.cli"))
register(Command("bench", "time the kernels and the peers on the named workloads (GPU)",
                 forward="swattn.bench.cli:main"))
register(from_module("memory-sim", "KV pages of a trace at real model shapes: swattn.memory "
                     "against vLLM's, SGLang's and a window-unaware cache's policies",
                     "swattn.memory.sim"))


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------

def typed_prog():
    """The program as the user typed it, for usage lines: ``swattn``, or ``python -m
    swattn`` (argparse's own default, taken from ``sys.argv[0]``, would say
    ``__main__.py``)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if name == "__main__.py":
        return f"{os.path.basename(sys.executable) or 'python'} -m swattn"
    return name or "swattn"


def build_parser(prog="swattn"):
    parser = argparse.ArgumentParser(
        prog=prog,
        description="swattn: sliding-window attention kernels for LLM serving, the engine demo, "
                    "the bound prover and the tile model. "
                    f"With no command, runs '{DEFAULT_COMMAND}'.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"swattn {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        if command.forward is not None:
            subparsers.add_parser(command.name, help=command.help, add_help=False)
            continue
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        if command.add_arguments is not None:
            command.add_arguments(sub)
        sub.set_defaults(run=command.run, prog=sub.prog)
    return parser


def main(argv=None, prog=None):
    """Run ``swattn`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status.
    ``prog``: the program named in usage lines (default: as typed, :func:`typed_prog`, when
    the arguments are the command line's, else ``swattn``)."""
    if prog is None:
        prog = typed_prog() if argv is None else "swattn"
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, DEFAULT_COMMAND)
    command = COMMANDS.get(argv[0])
    if command is not None and command.forward is not None:
        return _load(command.forward)(argv[1:], prog=f"{prog} {argv[0]}")
    args = build_parser(prog).parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
