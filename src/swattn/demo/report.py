"""The demo's progress bar and summary table: rich where installed (``swattn[demo]``),
plain text otherwise."""

from __future__ import annotations

import io
import sys

import torch

try:
    import rich.console
    import rich.progress
    import rich.table
except ImportError:  # pragma: no cover - the plain-text fallback
    rich = None


class Progress:
    """A progress bar of generated tokens: ``update(done, total)``."""

    def __init__(self, total, label):
        self.total, self.label, self.bar = total, label, None

    def __enter__(self):
        if rich is not None and sys.stdout.isatty():
            self.bar = rich.progress.Progress(
                rich.progress.TextColumn(self.label), rich.progress.BarColumn(),
                rich.progress.MofNCompleteColumn(), rich.progress.TimeElapsedColumn())
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        self._printed = 0
        return self

    def update(self, done, total):
        if self.bar is not None:
            self.bar.update(self.task, completed=done)
        elif done * 4 // total > self._printed:  # a line at each quarter
            self._printed = done * 4 // total
            print(f"  {self.label}: {done}/{total} tokens", flush=True)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


def _rows(engine, requests, rows, checks, longest):
    s = engine.stats
    out = [("requests", f"{len(requests)} (longest {longest} tokens)"),
           ("steps", f"{s['steps']} (token budget {engine.token_budget} a step)"),
           ("tokens computed", f"{s['tokens']} ({s['generated']} generated)"),
           ("prefix cache", f"{s['cached_tokens']} of {s['prompt_tokens']} prompt tokens "
                            f"served from cached pages"),
           ("swattn engine", f"{s['seconds']:.2f} s, {s['generated'] / s['seconds']:.1f} tokens/s "
                             f"(planning on the host {s['plan_seconds']:.2f} s, the model's "
                             f"forward {s['forward_seconds']:.2f} s)")]
    for name, row in rows.items():
        if name == "engine":
            continue
        if "error" in row:
            out.append((f"transformers {name}", f"not run: {row['error']}"))
        else:
            sec = row["seconds"]
            out.append((f"transformers {name}", f"{sec:.2f} s, {s['generated'] / sec:.1f} tokens/s"))
    full, window = engine.pools["full"].peak, engine.pools["window"].peak
    saved = 1 - window / full if full else 0.0
    out.append(("pages held (peak)", f"full layers {full}, window layers {window}; a window-"
                                     f"unaware cache holds {full} in the window layers "
                                     f"({saved:.0%} saved there)"))
    if engine.kv_dtypes["full"] != engine.dtype:
        held = sum(c.numel() * c.element_size() for pair in engine.caches for c in pair)
        size = torch.empty((), dtype=engine.dtype).element_size()
        wide = sum(c.numel() * size for pair in engine.caches for c in pair)
        out.append(("KV cache", f"full layers {str(engine.kv_dtypes['full'])[6:]} (scale 1), "
                                f"window layers {str(engine.dtype)[6:]}: {held / 2**20:.2f} MiB "
                                f"against {wide / 2**20:.2f} MiB all in "
                                f"{str(engine.dtype)[6:]}"))
    tiles, unbounded = s["tiles"], s["tiles_unbounded"]
    out.append(("key tiles, window layers", f"{tiles} walked; an unbounded kernel walks "
                                            f"{unbounded} ({tiles / max(unbounded, 1):.2f}x)"))
    for label, (same, total, prefix, tokens, gap) in checks:
        note = "" if gap is None else (
            f"; up to each first difference the logits agree within {gap:.1e} of eager's largest")
        out.append((f"tokens = eager ({label})",
                    f"{same} of {total} requests identical; {prefix} of {tokens} generated "
                    f"tokens before a request's first difference{note}"))
    return out


def summary(engine, requests, rows, checks, longest):
    """The summary table as text."""
    items = _rows(engine, requests, rows, checks, longest)
    if rich is not None:
        table = rich.table.Table(title="swattn demo", show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for key, value in items:
            table.add_row(key, value)
        buffer = io.StringIO()
        rich.console.Console(file=buffer, width=110).print(table)
        return buffer.getvalue().rstrip()
    width = max(len(k) for k, _ in items)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in items)
