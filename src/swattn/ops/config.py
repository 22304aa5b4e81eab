"""Tile and launch configs: pure functions of the shape (tested without a GPU)."""

from dataclasses import dataclass

# The loop-bound variants every launcher takes (DESIGN: tight iterates only the tiles that
# can hold a visible key; skip walks every tile and skips the matrix work of fully masked
# ones; none computes every tile under the mask). All three give the same bits.
BOUNDS = ("tight", "skip", "none")


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    pack_gqa: bool = False
    split_full: bool = True
    # Mask-free tiles load by tensor-memory copy (TMA) where the layout allows.
    tma: bool = True
    # The Gluon fast path (ops.extend_hopper) where the launch can take it (sm_90, ...).
    hopper: bool = False


# Every tiling extend_config can return; tests and `swattn verify` walk all of them.
EXTEND_TILINGS = ((64, 32), (128, 64), (64, 64), (32, 64), (16, 16))


def packs_gqa(config, group):
    """Whether a launch packs the query heads of a KV group into the rows of a block: asked
    for, a group of 2 or more, a power of two, and at most BLOCK_M / 2 so a block still
    holds two tokens."""
    return (config.pack_gqa and group > 1 and group & (group - 1) == 0
            and 2 * group <= config.block_m)


def extend_config(head_dim, head_dim_v, group, window_left, dtype, device, page_size=16):
    """(BLOCK_M, BLOCK_N, warps, stages, pack GQA, split off mask-free tiles, TMA) of the
    two-stage kernel.

    On the GPU the tile shrinks as the head grows so q, the accumulator and one K/V tile
    stay in registers. H200 sweeps (scripts/tune.py, benchmarks/results/): gpt-oss
    (d64, group 8, window 128) is fastest with 8 tokens x 8 heads a block and 32-key
    tiles in one masked loop (304 us at P8192 E8192 against 368 with the mask-free tiles
    split off and loaded by TMA, 348 for 16 tokens); Mistral (d128, group 4, window 4096)
    with 128 x 64 tiles, 8 warps, 3 stages over pages of 16 (5697 us at P8192 E8192 with
    the new tokens' mask-free tiles loaded by TMA, 5857 without; 6148 for 64 x 64 tiles and
    4 warps), but over pages of 64, whose whole key tiles the cache also loads by TMA, 64 x
    64 tiles and 4 warps (5209 us against 6021 for 128 x 64 and 8 warps; 3941 against 3931
    at prefix 0, where the cache is not read). On sm_90 the Gluon fast path takes d128
    (ops.extend_hopper: 64 x 64 tiles, 4 warps, the products overlapped with the softmax;
    benchmarks/results/2026-12-01-h200-hopper-extend), and gpt-oss's d64 too: 1-2% slower than
    the packed Triton kernel in the hopper-extend run (297.6 against 293.1 us at P0 E8192), 6% faster
    on every row of workload A since the hopper-loop run's changes to the Hopper loop (274.9 against
    291.6 us at P0 E8192; benchmarks/results/2026-12-01-h200-hopper-loop/extend-A-8f06f04.md).
    The Triton config stays for launches the Hopper path does not take.
    Windows shorter than a few key tiles have no mask-free tiles to split off. The
    interpreter runs small tiles: its cost grows with tile area, not launch count.
    """
    split = window_left is None or window_left >= 4 * 64
    if getattr(device, "type", device) != "cuda":
        return Config(16, 16, 4, 1, False, True)
    width = max(head_dim, head_dim_v)
    if width <= 64:
        return Config(64, 32, 4, 2, True, split, hopper=True)
    if width <= 128:
        # The Gluon fast path where the launch can take it (sm_90, D = Dv, ...).
        if page_size % 64 == 0:
            return Config(64, 64, 4, 3, True, split, hopper=True)
        return Config(128, 64, 8, 3, True, split, hopper=True)
    if width <= 256:
        return Config(64, 64, 8, 2, False, split)
    return Config(32, 64, 8, 1, False, split)


@dataclass(frozen=True)
class DecodeConfig:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    # The grid's fastest axis: the head block (a sequence's programs start side by side and
    # read its pages' rows together) or, False, the sequence.
    heads_first: bool = False
    # The Gluon fast path (ops.decode_hopper) where the launch can take it.
    hopper: bool = False

    @property
    def carry(self):
        """Whether the window loop carries the next tile's block-table entries: with 3
        stages or more, where it buys the K/V copies a second buffer (ops.decode)."""
        return self.num_stages > 2


def decode_config(head_dim, head_dim_v, group, dtype, device):
    """(BLOCK_H, BLOCK_N, warps, stages) of the decode kernel.

    BLOCK_H rows hold the query heads of one KV group (rows past the group are masked):
    at least 16, tl.dot's smallest side, so the group is the M of a tensor-core product.
    H200 sweep (scripts/tune.py, batch 64 at 32k): gpt-oss (d64, window 128) one 128-key
    tile, 9.7 us against 10.5 for two 64-key tiles; Mistral (d128, window 4096) 64-key
    tiles in 2 stages, heads first, 4 programs an SM, so C-B's 512 programs are one wave
    (benchmarks/results/2026-12-01-h200-decode-split-balance/decode-probe-*.log, two runs on one
    machine: 262.0 and 262.2 us against 265.8 and 265.6 for 32-key tiles in 3 stages, whose
    K/V copies the carried block-table entries double-buffer (ops.decode); the decode-double-buffer run's
    machine had it the other
    way, 266.5 against 265.4; 32-key tiles in 3 stages without the carried entries 302.7;
    64-key tiles in 3 stages need 70 KB of shared memory, 3 programs an SM, 1.29 waves:
    346 us). Two splits (1024 programs over 528 places) measured no faster: equal halves
    264.8 us, split 0 taking 90% of the keys 262.2 (the decode-split-balance run). Heads first measured 3%
    slower on C-A (9.2 against 9.0 us), so d64 keeps the sequence first. 32-key tiles above
    d128 keep K and V in registers next to the accumulator. The interpreter runs small
    tiles: its cost grows with tile area.

    ``hopper``: on sm_90, windows of HOPPER_MIN_KEYS keys or more and full attention at
    D = Dv in (64, 128) take the Gluon path (ops.decode_hopper) instead, which has its own
    tiles, stages and split count (:func:`hopper_decode_splits`).

    Heads wider than 256 (DeepSeek-style 576/512: keys as two products of 512 and 64
    columns) take 16 query heads and 32 keys a program, 4 warps, 2 stages, one split
    (batch 64 at 32k, 128 window + 480 sparse keys: 84.9 us against 111.1 for 16 keys,
    98.2 for 32 heads and 8 warps, 121.0 in two splits); before the split into two products
    (one of 1024 columns), 16 keys and 158.3 us.
    """
    del dtype
    block_h = dot_side(group)
    if getattr(device, "type", device) != "cuda":
        return DecodeConfig(block_h, 16, 4, 1)
    width = max(head_dim, head_dim_v)
    if width > 256:
        return DecodeConfig(16, 32, 4, 2)
    if width <= 64:
        return DecodeConfig(block_h, 128, 4, 2, hopper=True)
    if width <= 128:
        return DecodeConfig(block_h, 64, 4, 2, heads_first=True, hopper=True)
    return DecodeConfig(block_h, 32, 4, 2)


def head_blocking(config, group):
    """``(BLOCK_H, head blocks)``: the query heads of a KV group in blocks of BLOCK_H rows
    (at least 16, tl.dot's smallest side; a power of two), one program each."""
    block_h = dot_side(min(config.block_h, group))
    return block_h, -(-group // block_h)


def dot_side(n):
    """``n`` (head dim, or query heads of a head block) padded to a side tl.dot takes: the
    next power of two, 16 at least."""
    return max(16, 1 << max(n - 1, 0).bit_length())


def split_width(dim):
    """``(main, tail)`` dot widths of a key head dim: one power of two, or, where that
    wastes columns, the power of two below it and the rest padded (576 -> 512 + 64, 80 ->
    64 + 16, 96 -> 64 + 32); tail 0 when one product covers it."""
    whole = dot_side(dim)
    main = whole // 2
    tail = dot_side(dim - main) if dim > main else 0
    return (main, tail) if dim > 16 and main + tail < whole else (whole, 0)


# Split-KV programs per SM the chooser aims for (untuned).
DECODE_PROGRAMS_PER_SM = 2
# Fewest keys a split is given: a split costs a partial state written and read back and
# the merge launch, which a short chunk does not repay (H200, batch 64: gpt-oss window 128,
# 10.5 us in one split, 11.5 in two; DeepSeek-style 128 + 480 sparse keys, 158.3 us in one
# split, 172.8 in two of 304 keys).
DECODE_MIN_SPLIT_KEYS = 512
# SM count assumed off the GPU, where the interpreter runs one program at a time.
DECODE_CPU_SMS = 2


# The Gluon decode path (ops.decode_hopper) for windows of this many keys or more, and
# full attention, where the launch can take it (sm_90, D = Dv in 64/128, ...): H200,
# batch 64 at 32k (benchmarks/results/2026-12-01-h200-hopper-decode, the decode probes): C-B (4097 keys,
# d128) 258.6 us against 266.2 for the Triton kernel (FlashInfer 262.1), C-F (full, d64)
# 269.7 against about 283 (FlashInfer 282.1), but C-A (129 keys) 9.2 against 8.9.
HOPPER_MIN_KEYS = 1024
# Programs an SM the Gluon path holds (its registers and shared memory: two).
HOPPER_PROGRAMS_PER_SM = 2


def hopper_decode_splits(batch, kv_heads, max_keys, sm_count, block_n):
    """Split-KV chunks per (sequence, KV head) for the Gluon path: as many as still fit
    the programs in one wave (HOPPER_PROGRAMS_PER_SM x ``sm_count``), at least 1, capped
    as :func:`decode_splits` caps them. A grid past one wave is left whole: its
    programs then start wherever the first wave's end, which balances the SMs better
    than shorter, split programs and a merge (the hopper-decode run, H200, C-B: one split 258.6 us,
    two 262.5; C-F: two splits 269.7, four 272.6, eight 274.4)."""
    programs = max(batch * kv_heads, 1)
    wanted = HOPPER_PROGRAMS_PER_SM * sm_count // programs
    tiles = -(-max(max_keys, 1) // block_n)
    return max(1, min(wanted, tiles, max_keys // DECODE_MIN_SPLIT_KEYS))


def decode_splits(batch, kv_heads, max_keys, sm_count, block_n):
    """Split-KV chunks per (sequence, KV head): enough programs to fill
    DECODE_PROGRAMS_PER_SM x ``sm_count`` SMs, never more than the key tiles one sequence
    can hold (``max_keys``: the window plus any sparse keys), so no split starts empty for
    a sequence that fills its window, and none gets fewer than DECODE_MIN_SPLIT_KEYS
    keys; at least 1."""
    programs = max(batch * kv_heads, 1)
    wanted = -(-DECODE_PROGRAMS_PER_SM * sm_count // programs)
    tiles = -(-max(max_keys, 1) // block_n)
    return max(1, min(wanted, tiles, max_keys // DECODE_MIN_SPLIT_KEYS))
