"""The docs and docstrings state what the code does; current figures live in one file,
benchmarks/README.md, with the results folder, commit and command of each. A timing, a
ratio of speeds or a commit hash anywhere else in src/, docs/ or the README is out of date
the day the code changes, so it fails here: move it to benchmarks/README.md and link there.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCANNED = ("README.md", "docs", "src")

# A measurement: a number with a unit of time or of rate, a speed ratio ("1.8x", "5%
# faster"), two decimals set against each other ("9.7 against 9.3"), or a git commit hash
# (7 to 40 hex digits, at least one a letter and one a digit, standing alone). Shapes
# ("8 x 8192", "64x64"), exponents ("e^{2x}"), hex literals ("0x1f") and long decimal
# constants (1.4426950408889634) do not match.
FIGURES = {
    "timing": re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:us|µs|ms|ns)\b"
                         r"|(?<![\w.])\d+\.\d+\s?s\b"
                         r"|(?<![\w.])\d+(?:\.\d+)?\s?(?:[TGMK]?FLOP/s|[TGMK]i?B/s|tokens/s)"),
    "ratio": re.compile(r"(?<![\w.^{])\d+(?:\.\d+)?x(?=[\s,;:.)]|$)"
                        r"|(?<![\w.])\d+(?:\.\d+)?%\s(?:faster|slower|slow|fast)\b"
                        r"|(?<![\w.])\d+(?:\.\d+)?%\sof\s(?:the|its)\s(?:\w+\s)?roofline"
                        r"|(?<![\w.])\d+\.\d+\s(?:against|vs\.?)\s\d+\.\d+"),
    "commit": re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w])"),
}

def _files():
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
        else:
            yield from sorted(p for p in path.rglob("*") if p.suffix in (".py", ".md", ".rst"))


def figures(text):
    """``[(line number, kind, match)]`` of every figure in ``text``."""
    return [(number, kind, match.group(0))
            for number, line in enumerate(text.splitlines(), 1)
            for kind, pattern in FIGURES.items() for match in pattern.finditer(line)]


@pytest.mark.parametrize("text", [
    "C-B took 258.4 us over bf16", "1.2 ms a call", "13.02 s in all", "121.3 tokens/s",
    "at 2.7 TB/s", "600 TFLOP/s", "3.3x to 3.8x faster", "1.05x.", "(1.848x)",
    "5% slower", "1.2% faster", "97.6% of the copy roofline", "9.7 against 9.3",
    "at b066c81", "(5683a2f)", "since 0a7556d,",
], ids=lambda text: text.replace(" ", "-"))
def test_figures_are_found(text):
    assert figures(text), text


@pytest.mark.parametrize("text", [
    "8 x 8192 tokens", "a 64x64 tile", "e^{2x}", "shfl.sync.idx.b32 $0, $1, 0, 0x1f, 0xffffffff",
    "log2(e) = 1.4426950408889634", "D = Dv of 64 or 128", "[T, Hq, D]", "a 256 MB buffer",
    "2x2 blocks", "fp8 e4m3", "relative error 3e-2", "10% of the two caches' keys", "2026-12-04",
    "float8_e4m3fn", "the decoded block 1048576",
], ids=lambda text: text.replace(" ", "-"))
def test_legitimate_text_passes(text):
    assert not figures(text), figures(text)


def test_figures_live_in_benchmarks_readme():
    """Every timing, speed ratio and commit hash in the README, docs/ and src/ (a figure
    quoted away from benchmarks/README.md goes stale when the kernel changes)."""
    found = []
    for path in _files():
        relative = path.relative_to(ROOT).as_posix()
        found += [f"{relative}:{number}: {kind} {match!r}"
                  for number, kind, match in figures(path.read_text(encoding="utf-8"))]
    assert not found, "figures outside benchmarks/README.md:\n" + "\n".join(found)
