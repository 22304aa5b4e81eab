"""The window convention, the mask predicate and the key-tile bounds of every loop.

Plain Python: no torch, no triton. The kernels compile the ``*_tile``/``*_end``
primitives below with ``triton.jit`` (they use only ``+ - * //`` and ``min``/``max``,
which mean the same thing in both languages once the dividend is clamped at zero),
so a bound is written once and the prover, the tile model and the kernels share it.

Convention (FlashAttention's ``window_size=(L, R)``): a query at absolute position
``p`` sees the key at ``j`` iff ``p - L <= j`` (``L = window_left``) and ``j <= p``
when causal, or ``j <= p + R`` (``R = window_right``) when not. ``None`` is unbounded.
A causal window keeps exactly ``L + 1`` keys, the query's own included.

Coordinates of a loop: every loop walks a key range that starts at 0 in its own
coordinates and ends at ``range_end``; a query's position is written in the same
coordinates. Stage 1 (prefix keys) and the unified loop use absolute positions;
stage 2 (new keys) uses positions relative to the first new token, where queries
and keys shift by the same prefix length so the window predicate is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------------------
# Conversions between the conventions of the field.
# --------------------------------------------------------------------------------------

def check_window(window_left, window_right=None, causal=True):
    """Raise ValueError/TypeError unless the window arguments are well formed."""
    for name, value in (("window_left", window_left), ("window_right", window_right)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0 or None, got {value}")
    if causal and window_right is not None:
        raise ValueError("window_right applies only with causal=False "
                         "(causal already ends at the query)")


def from_hf(sliding_window):
    """Hugging Face ``config.sliding_window = W`` keeps W keys, the query's own included:
    ``window_left = W - 1``. ``None`` (no window) stays ``None``."""
    if sliding_window is None:
        return None
    if (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
            or sliding_window < 1):
        raise ValueError(f"sliding_window must be an int >= 1 or None, got {sliding_window!r}")
    return sliding_window - 1


def to_hf(window_left):
    """Inverse of :func:`from_hf`: ``W = window_left + 1``."""
    check_window(window_left)
    return None if window_left is None else window_left + 1


def from_flash_attn(window_size):
    """FlashAttention ``window_size=(left, right)``, ``-1`` meaning unbounded, to
    ``(window_left, window_right)`` with ``None`` meaning unbounded."""
    left, right = window_size
    return (None if left < 0 else left), (None if right < 0 else right)


def to_flash_attn(window_left, window_right=None, causal=True):
    """``(window_left, window_right)`` to FlashAttention's ``window_size``. Causal
    attention is ``right = 0`` there; FlashAttention also takes ``causal=True``."""
    check_window(window_left, window_right, causal)
    left = -1 if window_left is None else window_left
    if causal:
        return (left, 0)
    return (left, -1 if window_right is None else window_right)


def from_flashinfer(window_left):
    """FlashInfer's ``window_left`` (``-1`` = no window) is ours, with ``None`` for -1."""
    return None if window_left is None or window_left < 0 else window_left


def to_flashinfer(window_left):
    """Ours to FlashInfer's ``window_left``: ``None`` becomes -1."""
    check_window(window_left)
    return -1 if window_left is None else window_left


def from_sglang(sliding_window_size):
    """SGLang's ``sliding_window_size`` keeps key ``kv`` for query ``q`` iff
    ``q <= kv + sliding_window_size``: it is ``window_left``. Its kernels apply a window only
    when the size is above 0: 0 and below (-1 by default) are no window."""
    return (None if sliding_window_size is None or sliding_window_size <= 0
            else int(sliding_window_size))


def to_sglang(window_left):
    """Ours to SGLang's ``sliding_window_size`` (``-1`` = no window). A window of 0 (each
    query its own key only) has no SGLang size: its kernels read 0 as no window."""
    check_window(window_left)
    if window_left == 0:
        raise ValueError("window_left 0 has no SGLang sliding_window_size (its kernels read 0 "
                         "as no window)")
    return -1 if window_left is None else window_left


# --------------------------------------------------------------------------------------
# The mask predicate.
# --------------------------------------------------------------------------------------

def check_chunk(attention_chunk):
    """Raise ValueError/TypeError unless ``attention_chunk`` is None or an int >= 1."""
    if attention_chunk is None:
        return
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int):
        raise TypeError(f"attention_chunk must be an int or None, got "
                        f"{type(attention_chunk).__name__}")
    if attention_chunk < 1:
        raise ValueError(f"attention_chunk must be >= 1 or None, got {attention_chunk}")


def visible(q_pos, k_pos, window_left=None, window_right=None, causal=True, chunk=None):
    """True where the query at ``q_pos`` sees the key at ``k_pos``: the window, and with
    ``chunk`` (chunked local attention, Llama 4's ``attention_chunk_size``) the same chunk
    of ``chunk`` positions from position 0 (``k_pos // chunk == q_pos // chunk``).

    Works elementwise on ints and on numpy arrays (broadcasting): only comparisons, ``//``
    and ``&`` are used (positions >= 0). With no bound at all it returns plain ``True``.
    """
    keep = True
    if chunk is not None:
        keep = keep & (k_pos // chunk == q_pos // chunk)
    if window_left is not None:
        keep = keep & (k_pos >= q_pos - window_left)
    if causal:
        keep = keep & (k_pos <= q_pos)
    elif window_right is not None:
        keep = keep & (k_pos <= q_pos + window_right)
    return keep


# --------------------------------------------------------------------------------------
# Tile primitives. The kernels compile these with triton.jit: keep them to + - * //
# min max, clamp before dividing (Triton's // truncates, Python's floors), call nothing.
# --------------------------------------------------------------------------------------

def first_key_tile(first_query_pos, window_left, block_n):
    """Start of the first key tile (tiles aligned to 0) that can hold a visible key.

    Row 0 of the query block (position ``p0``) sees the lowest key of the block,
    ``p0 - L``; a tile ``[n, n + BN)`` can hold it iff ``n + BN - 1 >= p0 - L``, whose
    smallest multiple of BN is ``floor((p0 - L) / BN) * BN``, clamped at the range start 0.
    """
    return max(first_query_pos - window_left, 0) // block_n * block_n


def visible_key_end(first_query_pos, window_left, first_tile, key_end):
    """The loop end once the first tile is known: ``key_end`` (causal or right end), or
    the first tile itself when the block's lowest visible key ``p0 - L`` lies at or past
    ``key_end``, so a block that sees nothing in the range walks no tile (the floor of an
    unaligned range end would otherwise leave one dead tile to walk)."""
    return key_end if first_query_pos - window_left < key_end else first_tile


def full_tiles_start(last_query_pos, window_left, lo, block_n):
    """First tile of the loop's grid (``lo + i * BN``) whose every key every row sees from
    the left: its first key is at least the LAST row's lowest key ``p_last - L``, so
    ``lo + ceil((p_last - L - lo) / BN) * BN``, never below ``lo``. Tiles from here up to
    :func:`full_tiles_end` need no mask."""
    return lo + (max(last_query_pos - window_left - lo, 0) + block_n - 1) // block_n * block_n


def full_tiles_end(first_row_key_end, lo, block_n):
    """End of the last tile of the grid whose every key every row sees on the right: all
    its keys lie below the FIRST row's key end (its causal or right end, or the range end),
    so ``lo + floor((end - lo) / BN) * BN``."""
    return lo + max(first_row_key_end - lo, 0) // block_n * block_n


def causal_key_end(last_query_pos, range_end):
    """End (exclusive) of the keys a causal query block can see: the last row's
    position plus one, never past the range end."""
    return min(last_query_pos + 1, range_end)


def right_key_end(last_query_pos, window_right, range_end):
    """End (exclusive) of the keys a non-causal block with ``window_right = R`` can see:
    the last row sees up to ``p_last + R``; never past the range end."""
    return min(last_query_pos + window_right + 1, range_end)


def decode_first_key(seq_len, window_left):
    """First key a decode query (at ``seq_len - 1``) sees: ``seq_len - 1 - L``, clamped
    at 0. The decode loop starts exactly there (its tiles are gathered row by row, so
    they need no alignment), and reads ``[first, seq_len)``: ``L + 1`` keys at most."""
    return max(seq_len - 1 - window_left, 0)


def decode_chunk_first_key(seq_len, chunk):
    """First key of the decode query's chunk (chunked local attention, the query at
    ``seq_len - 1``): ``(seq_len - 1) // C * C``, the dividend clamped at 0. Under a window
    too, the decode loop starts at the later of this and :func:`decode_first_key`."""
    return max(seq_len - 1, 0) // chunk * chunk


def aligned_tiles(lo, hi, block_n):
    """``(first tile, end tile)`` of the keys ``[lo, hi)`` on the grid of absolute position
    0 (tile ``t`` holds keys ``[t * BN, (t + 1) * BN)``): the copy engine's tiles of the
    Hopper decode path, whose pages it loads whole."""
    end = (hi + block_n - 1) // block_n
    return lo // block_n, end


def split_tiles(t_lo, t_end, num_splits, i_split):
    """``(t_start, t_stop)``: split ``i_split``'s run of the tiles ``[t_lo, t_end)`` cut
    into ``num_splits`` contiguous runs of ``ceil((t_end - t_lo) / num_splits)`` tiles (the
    last ones shorter or empty)."""
    per_split = (t_end - t_lo + num_splits - 1) // num_splits
    t_start = min(t_lo + i_split * per_split, t_end)
    t_stop = min(t_start + per_split, t_end)
    return t_start, t_stop


def row_key_range(q_pos, origin, range_end, window_left, window_right, chunk,
                  USE_WINDOW, USE_CHUNK, IS_CAUSAL, USE_RIGHT):
    """``(lo, hi)``: the keys ``[lo, hi)`` of a loop's range ``[0, range_end)`` that the query
    at ``q_pos`` sees, both in the loop's coordinates (``origin`` + a loop position = the
    absolute position; chunks start at absolute position 0). Under a window, a chunk and
    causality (or a right window) a query's keys are one run: from the later of its
    window's first key and its chunk's first position, to the earlier of its own position
    (or its right window's end), its chunk's end and the range end. Empty (``lo >= hi``)
    when it sees none. The kernels compile it for a vector of rows (``max``/``min`` are
    then elementwise) under chunked attention and given positions, and take the block's
    bounds from the rows' ranges (:func:`range_bounds`)."""
    lo = q_pos - q_pos
    hi = lo + range_end
    if USE_WINDOW:
        lo = max(lo, q_pos - window_left)
    if USE_CHUNK:
        chunk_start = (q_pos + origin) // chunk * chunk - origin
        lo = max(lo, chunk_start)
        hi = min(hi, chunk_start + chunk)
    if IS_CAUSAL:
        hi = min(hi, q_pos + 1)
    elif USE_RIGHT:
        hi = min(hi, q_pos + window_right + 1)
    return lo, hi


# --------------------------------------------------------------------------------------
# Loop bounds, composed from the primitives, for the model, the prover and the launchers.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """The window of one launch. ``causal`` here means "ends at the query": with a custom
    mask, causality is replaced by the mask and the loops run as non-causal."""

    left: int | None = None
    right: int | None = None
    causal: bool = True
    # Chunked local attention: a query sees only the keys of its own chunk of this many
    # positions (the loops then take their bounds from the rows' ranges: row_key_range).
    chunk: int | None = None

    def __post_init__(self):
        check_window(self.left, self.right, self.causal)
        check_chunk(self.chunk)


def _loop_range(loop, prefix_len, extend_len, block_start, block_m):
    """(range_end, first query pos, last query pos) of one query block, in the loop's
    coordinates (see the module docstring)."""
    last_row = min(block_start + block_m, extend_len) - 1
    if loop == "stage1":
        return prefix_len, prefix_len + block_start, prefix_len + last_row
    if loop == "stage2":
        return extend_len, block_start, last_row
    if loop == "unified":
        return prefix_len + extend_len, prefix_len + block_start, prefix_len + last_row
    raise ValueError(f"loop must be one of 'stage1', 'stage2', 'unified', got {loop!r}")


def key_bounds(loop, prefix_len, extend_len, block_start, block_m, block_n, window, bounds="tight"):
    """``(lo, hi)``: the key range the loop walks for the query block whose first new
    token is ``block_start``, in tiles of ``block_n`` from ``lo`` (a multiple of BN).

    ``bounds="tight"`` starts at the first tile that can hold a visible key and ends at
    the last key any row can see; ``"all"`` starts at the range start and keeps only
    the causal end (SGLang's loops; the launchers' ``bounds="skip"`` walks this range);
    ``"none"`` walks the whole range.
    """
    if window.chunk is not None:
        return _row_bounds(loop, prefix_len, extend_len, block_start, block_m, block_n, window,
                           bounds)[:2]
    range_end, first_q, last_q = _loop_range(loop, prefix_len, extend_len, block_start, block_m)
    if bounds == "none":
        return 0, range_end
    end = range_end
    if window.causal:
        end = causal_key_end(last_q, range_end)
    elif window.right is not None and bounds == "tight":
        end = right_key_end(last_q, window.right, range_end)
    if bounds not in ("tight", "all"):
        raise ValueError(f"bounds must be 'tight', 'all' or 'none', got {bounds!r}")
    lo = 0
    if bounds == "tight" and window.left is not None:
        lo = first_key_tile(first_q, window.left, block_n)
        end = visible_key_end(first_q, window.left, lo, end)
    return lo, max(end, lo)


def full_tile_range(loop, prefix_len, extend_len, block_start, block_m, block_n, window, lo, hi):
    """``(mid_lo, mid_hi)``: the tiles of ``range(lo, hi, BN)`` in which every row of the
    block sees every key, so the kernels skip the mask there (``lo <= mid_lo <= mid_hi <=
    hi``, both on the grid of ``lo``). Bit-identical to masking them: the mask is all true."""
    if window.chunk is not None:
        return _row_bounds(loop, prefix_len, extend_len, block_start, block_m, block_n, window,
                           "tight")[2:]
    range_end, first_q, last_q = _loop_range(loop, prefix_len, extend_len, block_start, block_m)
    end = range_end
    if window.causal:
        end = causal_key_end(first_q, range_end)
    elif window.right is not None:
        end = right_key_end(first_q, window.right, range_end)
    mid_lo = lo if window.left is None else full_tiles_start(last_q, window.left, lo, block_n)
    mid_lo = min(mid_lo, hi)
    return mid_lo, max(min(full_tiles_end(end, lo, block_n), hi), mid_lo)


def _row_bounds(loop, prefix_len, extend_len, block_start, block_m, block_n, window, bounds):
    """``(lo, hi, mid_lo, mid_hi)`` of a query block whose rows' keys are each one run
    (:func:`row_key_range`: chunked attention), as the kernels take them: the rows'
    ranges through :func:`range_bounds`."""
    range_end, first_q, last_q = _loop_range(loop, prefix_len, extend_len, block_start, block_m)
    origin = prefix_len if loop == "stage2" else 0
    rows = [row_key_range(q, origin, range_end, window.left or 0, window.right or 0,
                          window.chunk, window.left is not None, window.chunk is not None,
                          window.causal, not window.causal and window.right is not None)
            for q in range(first_q, last_q + 1)]
    return range_bounds([(max(a, 0), b) for a, b in rows], block_n, range_end, bounds)


def range_bounds(rows, block_n, range_end, bounds="tight"):
    """``(lo, hi, mid_lo, mid_hi)`` of a query block whose rows each see their own key range:
    row ``t`` sees the keys ``[a_t, b_t)`` of ``[0, range_end)`` (``rows``: one ``(a_t, b_t)``
    a row of the block that holds a query; a row with ``a_t >= b_t`` sees nothing). The
    extend kernel's stage 1 under ``key_ranges`` (context parallelism: a rank's local keys).

    ``bounds="tight"``: from the first tile that holds the lowest key a row sees to the
    highest key end, nothing when no row sees a key; ``"all"``: from 0 to that end;
    ``"none"``: the whole range. The mask-free tiles ``[mid_lo, mid_hi)`` are those every
    row sees whole: from the highest range start to the lowest range end, so none when a
    row sees nothing. The ranges need no order: the kernel reduces its rows' bounds."""
    seen = [(a, b) for a, b in rows if a < b]
    start = min((a for a, _ in seen), default=range_end)
    end = max((b for _, b in seen), default=0)
    if bounds == "none":
        lo, hi = 0, range_end
    elif bounds == "all":
        lo, hi = 0, min(end, range_end)
    elif bounds == "tight":
        lo = first_key_tile(start, 0, block_n)
        hi = max(min(end, range_end), lo)
    else:
        raise ValueError(f"bounds must be 'tight', 'all' or 'none', got {bounds!r}")
    mid_lo = min(full_tiles_start(max(a for a, _ in rows), 0, lo, block_n), hi)
    mid_hi = max(min(full_tiles_end(min(min(b for _, b in rows), range_end), lo, block_n), hi),
                 mid_lo)
    return lo, hi, mid_lo, mid_hi


def decode_bounds(seq_len, window_left, chunk=None):
    """``(lo, hi)`` of the decode loop: the keys ``[seq_len - 1 - L, seq_len)``, and with
    ``chunk`` only those of the query's chunk: from ``max(seq_len - 1 - L, (seq_len - 1) //
    C * C)``."""
    lo = 0 if window_left is None else decode_first_key(seq_len, window_left)
    if chunk is not None:
        lo = max(lo, decode_chunk_first_key(seq_len, chunk))
    return lo, seq_len


def decode_split_bounds(seq_len, window_left, block_n, num_splits, i_split, aligned=False,
                        chunk=None):
    """``(start, stop)``: the keys split ``i_split`` of ``num_splits`` walks in tiles of
    ``block_n`` (the kernels mask those outside :func:`decode_bounds`). The Triton decode
    kernel tiles ``[lo, seq_len)`` from ``lo`` (its rows are gathered one by one);
    ``aligned``, the Hopper decode path tiles it on the grid of 0 (:func:`aligned_tiles`).
    Either way the tiles are cut into contiguous runs by :func:`split_tiles`."""
    lo, hi = decode_bounds(seq_len, window_left, chunk)
    if aligned:
        t_lo, t_end = aligned_tiles(lo, hi, block_n)
        t_start, t_stop = split_tiles(t_lo, t_end, num_splits, i_split)
        return t_start * block_n, t_stop * block_n
    t_start, t_stop = split_tiles(0, num_tiles(lo, hi, block_n), num_splits, i_split)
    return lo + t_start * block_n, lo + t_stop * block_n


# --------------------------------------------------------------------------------------
# Which lengths a kernel takes: the guard every launch applies on the device, so lengths
# nobody checked on the host (a one-shot call's device tensors) never reach memory out of
# bounds and never overflow a position.
# --------------------------------------------------------------------------------------

# Positions stop below this (a billion tokens): a position plus a window, a tile or a
# chunk then stays within int32 in every bound above.
MAX_POSITION = 1 << 30


def clamp_extent(extent):
    """A window, or a count of keys, as the kernels take it: at most :data:`MAX_POSITION`
    (a window that wide already spans every position)."""
    return min(extent, MAX_POSITION)


def extend_seq_ok(seq_start, seq_end, earlier, prefix_len, num_tokens, prefix_keys):
    """Whether a sequence of an extend batch is well formed, as the kernels see it: its new
    tokens ``[seq_start, seq_end)`` (``cu_seqlens[b]``, ``cu_seqlens[b + 1]``) lie within the
    ``num_tokens`` rows of q and after every earlier entry of ``cu_seqlens`` (``earlier``:
    their largest, ``seq_start`` included), so no two sequences share a row; its prefix is
    at least 0 and at most ``prefix_keys`` (the keys its block-table row maps), and its last
    position stays below :data:`MAX_POSITION`. The kernels attend no other sequence: its
    rows come out NaN (the one-shot calls' :func:`uncovered_rows`), its pages are never
    read. Elementwise (``&``), so the kernels evaluate it on a vector of sequences."""
    return ((seq_start >= 0) & (seq_start >= earlier) & (seq_end >= seq_start)
            & (seq_end <= num_tokens) & (prefix_len >= 0) & (prefix_len <= prefix_keys)
            & (prefix_len <= MAX_POSITION - (seq_end - seq_start)))


def ring_width(window_left, max_new, page_size):
    """Columns of a ring block table (logical page ``i`` at column ``i % width``, fixed in
    size for CUDA graphs) that no step reads twice: a step adding up to ``max_new`` tokens
    under a window of ``L = window_left`` reads at most ``L + max_new`` keys, over at most
    ``ceil((L + 1 + max_new) / page_size) + 1`` pages (the window's first page partial)."""
    return -(-(window_left + 1 + max_new) // page_size) + 1


def ring_column(logical_page, width):
    """The column of a ring block table of ``width`` columns holding ``logical_page``."""
    return logical_page % width


def decode_seq_ok(seq_len, cached_keys):
    """Whether a decode sequence is well formed: ``0 <= seq_len <= cached_keys`` (the keys
    its block-table row maps, at most :data:`MAX_POSITION`). Any other output row is NaN."""
    return (seq_len >= 0) & (seq_len <= cached_keys)


def mask_ok(mask_start, new_len, prefix_len, mask_entries):
    """Whether a sequence's custom-mask rows lie in the mask: its ``E * (P + E)`` entries
    from ``mask_start`` (``mask_indptr[b]``) within the ``mask_entries`` the mask holds. The
    kernels evaluate it in int64, on lengths :func:`extend_seq_ok` has passed."""
    return (mask_start >= 0) & (mask_start + new_len * (prefix_len + new_len) <= mask_entries)


def uncovered_rows(cu_seqlens, prefix_lens, num_tokens, prefix_keys):
    """The rows of q that no well-formed sequence (:func:`extend_seq_ok`) owns, as a list:
    the rows a one-shot extend call fills with NaN. Host lists; the kernels compute the
    same on the device."""
    covered = [False] * num_tokens
    earlier = None
    for b, prefix_len in enumerate(prefix_lens):
        start, end = cu_seqlens[b], cu_seqlens[b + 1]
        earlier = start if earlier is None else max(earlier, start)
        if extend_seq_ok(start, end, earlier, prefix_len, num_tokens, prefix_keys):
            covered[start:end] = [True] * (end - start)
    return [t for t in range(num_tokens) if not covered[t]]


def num_tiles(lo, hi, block_n):
    """Tiles a ``range(lo, hi, block_n)`` loop visits."""
    return max(hi - lo + block_n - 1, 0) // block_n


# --------------------------------------------------------------------------------------
# A second key source (DeepSeek-V3.2 / V4): entries of a second paged cache that a query
# attends beside its window, in the same softmax. Entry ``e`` at compression rate ``r``
# summarises the positions ``[e * r, (e + 1) * r)``; it is closed, and visible, once the
# query's position has reached its last one: ``e < (p + 1) // r`` (rate 1: an ordinary
# token, causal ``e <= p``). transformers' DeepSeek-V4 writes the same limit as
# ``entry < (position + 1) // compress_rate``.
# --------------------------------------------------------------------------------------

def second_limit(query_pos, rate, entries):
    """The entries ``[0, limit)`` the query at ``query_pos`` may see: those closed by its
    position, and at most the ``entries`` the sequence's second cache holds (none past them
    is ever read). ``query_pos`` is at least 0 where a kernel evaluates it."""
    return min((query_pos + 1) // rate, max(entries, 0))


def second_tiles(query_pos, rate, entries, block_n, bounds="tight"):
    """``(start, stop)`` of the entries a rate-mode loop walks in tiles of ``block_n``:
    from 0 to the limit (``tight``), or to every entry the sequence holds (``skip``,
    ``none``: the tiles past the limit masked, and skipped or computed). An index-mode loop
    walks its index list whole, whatever the bounds."""
    hi = second_limit(query_pos, rate, entries) if bounds == "tight" else max(entries, 0)
    return 0, num_tiles(0, hi, block_n) * block_n


def segment_tiles(t_start, t_stop, first, count):
    """``(a, b)``: the tiles of a segment of ``count`` tiles, starting at tile ``first`` of a
    row's run of tiles (its cached window's, its new keys', its second source's one after
    another), that the split owning the run's tiles ``[t_start, t_stop)``
    (:func:`split_tiles`) walks, counted from the segment's first tile."""
    a = min(max(t_start - first, 0), count)
    b = min(max(t_stop - first, 0), count)
    return a, b


def second_entries_ok(entries, capacity):
    """Whether a sequence's second-cache entry count is well formed: ``0 <= entries <=
    capacity`` (the entries its second block-table row maps). Any other row is NaN."""
    return (entries >= 0) & (entries <= capacity)


def rows_ok(row, seq_start, seq_end, prefix_len, num_tokens, prefix_keys):
    """Whether an extend row the second-source kernel attends is well formed: it lies in its
    sequence's new tokens ``[seq_start, seq_end)`` within the ``num_tokens`` rows of q, the
    prefix is within the ``prefix_keys`` its block-table row maps, and its position stays
    below :data:`MAX_POSITION`. Any other row is NaN; the new keys it reads are rows
    ``[seq_start, row]`` of k and v, all within q's."""
    return ((seq_start >= 0) & (seq_start <= row) & (row < seq_end) & (seq_end <= num_tokens)
            & (prefix_len >= 0) & (prefix_len <= prefix_keys)
            & (prefix_len < MAX_POSITION - (row - seq_start)))
