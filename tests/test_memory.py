"""swattn.memory without kernels: what each call allocates, frees, refuses and shares."""

import pytest
import torch

from swattn.memory import (
    BlockTables,
    KVMemory,
    LayerGroup,
    OutOfPages,
    Schedule,
    first_page_kept,
    ring_width,
    slot_mapping,
)


def _memory(pages=32, page=4, window=7, chunk=8, schedule=None, **kwargs):
    groups = [LayerGroup("full", page, pages),
              LayerGroup("window", page, pages, window_left=window),
              LayerGroup("chunk", page, pages, attention_chunk=chunk)]
    return KVMemory(groups, schedule or Schedule(8, max_drafts=2, lag=1), **kwargs)


def _held(memory, seq):
    return {name: [j for j, p in enumerate(memory.pages(name, seq)) if p >= 0]
            for name in memory.groups}


def test_window_pages_slide_and_full_pages_stay():
    memory = _memory()
    memory.add("a")
    for _ in range(4):
        memory.reserve("a", 8)
        memory.commit("a")
    # Committed 32: the next query (32) sees keys from 25 (window 7: page 6) and from 32
    # (chunk 8: a chunk starts there, so no page).
    assert _held(memory, "a") == {"full": list(range(8)), "window": [6, 7], "chunk": []}
    assert memory.held("window") == 2 and memory.held("full") == 8


def test_reservation_slots_follow_the_pages():
    memory = _memory()
    memory.add("a")
    r = memory.reserve("a", 6)
    for name in memory.groups:
        pages = memory.pages(name, "a")
        assert r.slots[name] == [pages[p // 4] * 4 + p % 4 for p in range(6)]
    assert r.start == 0 and r.num_tokens == 6
    assert slot_mapping([r], "window").tolist() == r.slots["window"]


def test_out_of_pages_changes_nothing():
    """A refusal names the group and the need, and leaves every pool as it was."""
    memory = _memory(pages=3)
    memory.add("a")
    memory.add("b")
    memory.reserve("a", 8)
    memory.commit("a")
    before = {n: (list(p.free), list(p.refs)) for n, p in memory.pools.items()}
    # a needs page 2, b pages 0 and 1: three, and one is free.
    with pytest.raises(OutOfPages, match="'full': 3 pages needed, 1 available") as error:
        memory.reserve_batch([("a", 1, 0), ("b", 5, 0)])
    assert isinstance(error.value, MemoryError) and error.value.group == "full"
    assert {n: (list(p.free), list(p.refs)) for n, p in memory.pools.items()} == before
    assert memory.open_steps("a") == [] and memory.open_steps("b") == []


def test_rejected_drafts_roll_back_and_later_steps_follow():
    memory = _memory(schedule=Schedule(4, max_drafts=3, lag=1))
    memory.add("a")
    memory.reserve("a", 4)
    memory.commit("a")
    first = memory.reserve("a", 4, drafts=3)  # positions 4..7
    second = memory.reserve("a", 4, drafts=3)  # 8..11 if all of the first is kept
    assert (first.start, second.start) == (4, 8) and len(memory.pages("full", "a")) == 3
    memory.commit("a", 1)  # keeps position 4: the second step now runs at 5..8
    assert memory.committed("a") == 5 and memory.reserved_end("a") == 9
    assert len(memory.pages("full", "a")) == 3  # page 2 holds position 8
    memory.commit("a", 1)
    assert memory.reserved_end("a") == 6 and len(memory.pages("full", "a")) == 2
    with pytest.raises(ValueError, match="accepted must be in"):
        memory.reserve("a", 2, drafts=1)
        memory.commit("a", 0)


def test_schedule_limits_are_enforced():
    memory = _memory(schedule=Schedule(4, max_drafts=1, lag=0))
    memory.add("a")
    with pytest.raises(ValueError, match="max_step_tokens"):
        memory.reserve("a", 5)
    with pytest.raises(ValueError, match="drafts"):
        memory.reserve("a", 4, drafts=2)
    memory.reserve("a", 2)
    with pytest.raises(ValueError, match="lag 0 allows 1"):
        memory.reserve("a", 2)
    with pytest.raises(ValueError, match="open steps"):
        memory.release("a")
    with pytest.raises(ValueError, match="max_drafts"):
        Schedule(2, max_drafts=2)


def test_ring_rows_hold_every_held_page_on_its_own_column():
    schedule = Schedule(8, max_drafts=2, lag=1)
    memory = _memory(schedule=schedule)
    memory.add("a")
    for step in range(12):
        memory.reserve("a", 8 if step < 3 else 3, 0 if step < 3 else 2)
        if step:  # the previous step finishes while this one is planned
            count, drafts = memory.open_steps("a")[0]
            memory.commit("a", count - drafts if step % 2 else count)
        for name in ("window", "chunk"):
            width = ring_width(memory.groups[name], schedule)
            row = memory.ring_row(name, "a")
            pages = memory.pages(name, "a")
            assert len(row) == width
            assert {j % width: p for j, p in enumerate(pages) if p >= 0} == {
                c: p for c, p in enumerate(row) if p >= 0}
    # Window 7, chunk 8, two open steps of 8 tokens, pages of 4: ceil((R + 1 + 16) / 4) + 1.
    assert ring_width(memory.groups["window"], schedule) == (7 + 1 + 16 + 3) // 4 + 1
    assert ring_width(memory.groups["chunk"], schedule) == (7 + 1 + 16 + 3) // 4 + 1
    with pytest.raises(ValueError, match="no ring"):
        memory.ring_row("full", "a")


def _compute(memory, seq, length, step=8):
    while memory.reserved_end(seq) < length:
        memory.reserve(seq, min(step, length - memory.reserved_end(seq)))
        memory.commit(seq)


def _prefill(memory, seq, prompt, step=8):
    memory.add(seq, prompt)
    _compute(memory, seq, len(prompt), step)


def test_hit_takes_only_the_pages_the_window_reads():
    memory = _memory(keep_prompt_ends=True)
    prompt = list(range(30))
    _prefill(memory, "a", prompt)
    memory.release("a")
    hit = memory.add("b", prompt + [99])
    assert (hit.tokens, hit.matched) == (28, 28)
    held = _held(memory, "b")
    assert held["full"] == list(range(7))
    assert held["window"] == list(range(first_page_kept(memory.groups["window"], 28), 7))
    assert held["chunk"] == [6]  # the chunk of position 28 starts at 24
    # The cache kept only the window's tail in the sliding groups.
    assert len(memory.cache.entries["window"]) == 2 and len(memory.cache.entries["full"]) == 7


def test_prompt_ends_are_kept_only_when_asked():
    """Without keep_prompt_ends a repeated prompt is cut short once, then hits."""
    memory = _memory()
    prompt = list(range(30))
    _prefill(memory, "a", prompt)
    assert len(memory.cache.entries["window"]) == 0 and len(memory.cache.entries["full"]) == 7
    hit = memory.add("b", prompt)
    assert (hit.tokens, hit.matched) == (0, 28)
    _compute(memory, "b", 30)
    assert memory.add("c", prompt).tokens == 28


def test_hit_cut_short_by_the_window_is_counted_and_healed():
    """Prompts sharing a 16-token system prompt: the first passed it before anyone asked,
    so the second's hit is cut short; the second leaves the system prompt's window tail in
    the cache, so the third hits."""
    memory = _memory()
    system = list(range(100, 116))
    _prefill(memory, "a", system + list(range(40)))
    hit = memory.add("b", system + [7, 7, 7, 7, 7])
    assert hit.matched == 16 and hit.tokens < 16
    assert memory.cache.stats.cut_short == 1 and memory.cache.stats.tokens_cut == 16 - hit.tokens
    _compute(memory, "b", 21)
    hit = memory.add("c", system + [9, 9, 9])
    assert (hit.tokens, hit.matched) == (16, 16)
    assert memory.cache.stats.hits == 1 and memory.cache.stats.cut_short == 1


def test_shared_pages_go_back_when_their_last_holder_lets_go():
    memory = _memory(keep_prompt_ends=True)
    prompt = list(range(30))
    _prefill(memory, "a", prompt)
    memory.add("b", prompt)
    shared = memory.pages("full", "b")[0]
    assert memory.pools["full"].refs[shared] == 3  # a, b and the cache
    memory.release("a")
    memory.release("b")
    assert memory.pools["full"].refs[shared] == 1
    memory.cache.clear()
    assert memory.pools["full"].held == 0 and memory.pools["window"].held == 0


def test_pool_short_evicts_cache_only_pages_least_recently_used_first():
    memory = _memory(pages=10)
    _prefill(memory, "a", list(range(30)))
    memory.release("a")
    assert memory.held("full") == 7  # cached
    memory.add("b")
    memory.reserve("b", 8)  # needs 2 full pages: 3 are free
    memory.commit("b")
    memory.reserve("b", 8)  # needs 2 more: 1 free, one evicted from the cache
    assert len(memory.cache.entries["full"]) == 6
    memory.commit("b")
    memory.add("c")
    with pytest.raises(OutOfPages):  # 7 pages: none free, 6 only the cache holds
        memory.reserve_batch([("b", 8, 0), ("b", 8, 0), ("c", 8, 0), ("c", 4, 0)])
    assert len(memory.cache.entries["full"]) == 6  # a refusal evicts nothing


def test_block_tables_are_written_in_place():
    memory = _memory()
    for seq in ("a", "b"):
        memory.add(seq)
        memory.reserve(seq, 8)
        memory.commit(seq)
    linear = BlockTables(memory, "window", max_batch=4, max_pages=16)
    ring = BlockTables(memory, "window", max_batch=4, layout="ring")
    pointers = (linear.table.data_ptr(), ring.table.data_ptr())
    host = linear.update(["b", "a"])
    assert host.tolist() == [memory.linear_row("window", s, 16) for s in ("b", "a")]
    ring.update(["a"])
    memory.reserve("a", 8)
    memory.commit("a")
    linear.update(["a"])
    ring.update(["a", "b"])
    assert (linear.table.data_ptr(), ring.table.data_ptr()) == pointers
    assert linear.table[0].tolist() == memory.linear_row("window", "a", 16)
    assert (linear.table[1:] == -1).all()
    assert ring.table[:2].tolist() == [memory.ring_row("window", s) for s in ("a", "b")]
    assert linear.table.dtype == torch.int32


def test_copy_is_independent():
    memory = _memory()
    memory.add("a", list(range(20)))
    memory.reserve("a", 8)
    other = memory.copy()
    other.commit("a")
    other.reserve("a", 8)
    assert memory.committed("a") == 0 and memory.pools["full"].held == 2
    assert other.committed("a") == 8 and other.pools["full"].held == 4


@pytest.mark.gpu
def test_device_tables_on_cuda_follow_every_update():
    """Two updates queued back to back (a step planned while one runs): each staged copy
    lands, in stream order, and the device table ends with the last rows."""
    memory = _memory()
    for seq in ("a", "b"):
        memory.add(seq)
        memory.reserve(seq, 8)
        memory.commit(seq)
    tables = BlockTables(memory, "window", max_batch=2, max_pages=16, device="cuda")
    pointer = tables.table.data_ptr()
    seen = []
    for order in (["a", "b"], ["b"], ["b", "a"]):
        tables.update(order)
        seen.append(tables.table.clone())
    torch.cuda.synchronize()
    want = [[memory.linear_row("window", s, 16) for s in order] + [[-1] * 16] * (2 - len(order))
            for order in (["a", "b"], ["b"], ["b", "a"])]
    assert [t.tolist() for t in seen] == want and tables.table.data_ptr() == pointer
