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
            out.append((f"transformers {name}",
                        f"{sec:.2f} s, {s['generated'] / sec:.1f} tokens/s"))
    out += page_rows(engine)
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


def page_rows(engine):
    """The pages rows: each group's peak and mean over the steps, against a window-unaware
    cache (which holds in the window layers what the full layers hold), and the prefix
    cache's hits, those the window cut short included."""
    over_time = engine.pages_over_time
    full, window = max(over_time["full"], default=0), max(over_time["window"], default=0)
    mean = {kind: sum(v) / max(len(v), 1) for kind, v in over_time.items()}
    share = window / full if full else 0.0
    cache = engine.memory.cache.stats
    return [
        ("pages held (peak)", (f"full layers {full}, window layers {window}; a window-unaware "
                               f"cache holds {full} in the window layers ({share:.0%} of it)")),
        ("pages held (mean a step)", (f"full layers {mean['full']:.1f}, window layers "
                                      f"{mean['window']:.1f} (a window-unaware cache "
                                      f"{mean['full']:.1f})")),
        ("window pages freed", (f"{engine.memory.pools['window'].frees} as the window slid "
                                f"past them")),
        ("prefix-cache hits", (f"{cache.hits} of {cache.lookups} lookups, {cache.hit_tokens} "
                               f"tokens; {cache.cut_short} cut short by the window "
                               f"({cache.tokens_cut} tokens)")),
    ]


def plot_pages(engine, path):
    """Pages held per step, each layer kind against a window-unaware cache, to ``path``
    (matplotlib, the ``bench`` extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    over_time = engine.pages_over_time
    steps = range(len(over_time["full"]))
    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.plot(steps, over_time["full"], label="full layers (= a window-unaware cache's "
                                              "window layers)")
    axes.plot(steps, over_time["window"], label="window layers (swattn.memory)")
    axes.set_xlabel("step")
    axes.set_ylabel("pages held")
    axes.set_title("swattn demo: KV pages held per layer kind")
    axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


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
