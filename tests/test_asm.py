"""The SASS comparison (swattn verify --asm): compiled for sm_90 with Triton's bundled
ptxas in a fresh process (the suite itself runs under the interpreter)."""

from checks import run_fresh

SCRIPT = """
from swattn.verify import asm
shape = asm.Shape("full non-causal d64", 8, 2, 64, None, causal=False)
report, ok = asm.run(shapes=[shape], variants=asm.VARIANTS[::2])
print(report)
assert ok
"""


def test_full_attention_bounds_fold_away_in_sass():
    """Where tight and none walk the same keys, they compile to the same instructions."""
    result = run_fresh(SCRIPT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "identical, instruction for instruction" in result.stdout
