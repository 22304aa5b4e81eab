"""The schedule prover: swattn.memory's free rule proves on its grid, and a rule one step
early or one page late does not."""

import argparse
import json

import pytest

from swattn.memory import first_page_kept
from swattn.verify import prove
from swattn.verify.prove_memory import (
    DEFAULT_MEMORY_GRID,
    FAILURES,
    QUICK_MEMORY_GRID,
    MemoryGrid,
    format_memory_report,
    prove_config,
    prove_memory,
)


def one_step_early(group, committed):
    """Frees for the committed length one decode step later: the page the step still
    running reads first goes back."""
    return first_page_kept(group, committed + 1)


def one_page_late(group, committed):
    """Keeps one page below the first one any step can read."""
    return max(first_page_kept(group, committed) - 1, 0)


@pytest.fixture(scope="module")
def quick():
    return prove_memory(QUICK_MEMORY_GRID)


def test_the_schedule_proves_on_the_quick_grid(quick):
    assert quick["ok"] and all(quick[key] == 0 for key in FAILURES)
    assert quick["configs"] == len(list(QUICK_MEMORY_GRID.configs()))
    # Every history walked: more states than configs, reads checked, pages freed, hits taken,
    # and a tightness witness (the lowest page held is read) in almost every state.
    assert quick["states"] > 10 * quick["configs"] and quick["reads"] > quick["states"]
    assert quick["frees"] > 0 and quick["hits"] == quick["configs"] // 2
    assert quick["witnesses"] > 0.9 * quick["states"]
    assert 0 < quick["max_held"] <= quick["width"]


@pytest.mark.parametrize("rule,failure", [(one_step_early, "violations"),
                                          (one_page_late, "late")],
                         ids=["one-step-early", "one-page-late"])
def test_planted_free_rules_are_caught(rule, failure):
    result = prove_memory(QUICK_MEMORY_GRID, rule)
    assert not result["ok"] and result[failure] > 0


@pytest.mark.parametrize("lag,drafts", [(0, 0), (1, 2), (2, 3)])
def test_early_rule_caught_under_every_lag(lag, drafts):
    """The early rule frees a page the oldest open step reads, whatever else is open."""
    stats = prove_config((4, None), 2, 3, drafts, lag, "fresh", ((16, 16),), one_step_early)
    assert stats["violations"] > 0


def test_a_window_of_zero_and_pages_of_one_token():
    """Window 0 (each query its own key) on one-token pages holds only the open steps'
    pages: the tightest case."""
    stats = prove_config((0, None), 1, 1, 0, 0, "fresh", ((16, 16),))
    assert stats["violations"] == stats["late"] == 0 and stats["max_held"] == 1


def test_default_grid_covers_the_cases():
    grid = DEFAULT_MEMORY_GRID
    assert {0, 1} <= {w for w, c in grid.windows if c is None}
    assert any(w is None for w, _ in grid.windows) and any(
        w is not None and c is not None for w, c in grid.windows)
    assert 1 in grid.page_sizes and {0, 1} <= set(grid.drafts) and {0, 1, 2} <= set(grid.lags)
    assert set(grid.starts) == {"fresh", "hit"}
    # A prefill step below, equal to and above a page; windows not multiples of pages.
    assert any(s % p for s in grid.prefill_steps for p in grid.page_sizes if p > 1)


def test_report_and_cli(capsys, quick):
    text = format_memory_report(quick)
    assert "schedule" in text and "freed early" in text and "held late" in text
    args = argparse.Namespace(quick=True, json=True, no_schedule=False)
    assert prove.run(args, keep_from=one_step_early) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is False and printed["schedule"]["violations"] > 0
    assert prove.run(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is True and printed["schedule"]["late"] == 0


def test_grid_describes_itself():
    grid = MemoryGrid(windows=((3, None),), page_sizes=(2,), prefill_steps=(1,), drafts=(0,),
                      lags=(0,))
    result = prove_memory(grid)
    assert result["configs"] == 2 and result["grid"]["windows"] == [[3, None]]
