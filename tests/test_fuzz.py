"""The property-based fuzz of the one-shot calls and the plans (fuzz_calls.py), in a
process of its own: a crash fails this test instead of ending the suite."""

import os
import subprocess
import sys

EXAMPLES = 250  # a draw each of extend and decode; about 10 s under the interpreter


def test_fuzz_calls_never_crash_and_never_give_garbage(seed):
    """Random sizes, lengths (inconsistent too), page ids, windows and dtypes: every draw
    raises ValueError/TypeError or gives rows that are computed or NaN (segfaults, hangs,
    stale rows and finite zeros before: docs/api.md, "Lengths")."""
    script = os.path.join(os.path.dirname(__file__), "fuzz_calls.py")
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, script, str(EXAMPLES), str(seed)], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    assert f"draws: {2 * EXAMPLES}" in result.stdout, result.stdout[-500:]
