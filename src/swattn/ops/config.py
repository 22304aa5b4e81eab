"""Tile and launch configs: pure functions of the shape (tested without a GPU)."""

from dataclasses import dataclass, replace

# The loop-bound variants every launcher takes (tight iterates only the tiles that can hold
# a visible key; skip walks every tile and skips the matrix work of fully masked
# ones; none computes every tile under the mask). All three give the same bits.
BOUNDS = ("tight", "skip", "none")


@dataclass(frozen=True, kw_only=True)
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
    """The two-stage kernel's tiles for a shape (fp16/bf16; fp32 takes the same tiles, a
    reference path that is not tuned).

    Off the GPU the interpreter runs small tiles (its cost grows with tile area). On the
    GPU the tile shrinks as the head grows, so q, the accumulator and a K/V tile stay in
    registers: d64 packs a KV group's query heads into the rows of a 64 x 32 block; d128
    takes 128 x 64 tiles and 8 warps over small pages, 64 x 64 and 4 warps over pages of
    64 (whose whole key tiles the cache then loads by TMA). Both prefer the Hopper path
    where a plan can take it. Windows of fewer than four key tiles have no mask-free tiles
    to split off. Why these tiles: the sweeps and runs of ``benchmarks/results/``
    (``scripts/tune.py``; for the Hopper path ``2026-12-01-h200-hopper-extend/`` and
    ``2026-12-01-h200-hopper-loop/``).
    """
    del dtype  # one table for fp16 and bf16 (and fp32)
    split = window_left is None or window_left >= 4 * 64
    if getattr(device, "type", device) != "cuda":
        return Config(block_m=16, block_n=16, num_warps=4, num_stages=1)
    width = max(head_dim, head_dim_v)
    if width <= 64:
        return Config(block_m=64, block_n=32, num_warps=4, num_stages=2, pack_gqa=True,
                      split_full=split, hopper=True)
    if width <= 128:
        if page_size % 64 == 0:
            return Config(block_m=64, block_n=64, num_warps=4, num_stages=3, pack_gqa=True,
                          split_full=split, hopper=True)
        return Config(block_m=128, block_n=64, num_warps=8, num_stages=3, pack_gqa=True,
                      split_full=split, hopper=True)
    if width <= 256:
        return Config(block_m=64, block_n=64, num_warps=8, num_stages=2, split_full=split)
    return Config(block_m=32, block_n=64, num_warps=8, num_stages=1, split_full=split)


@dataclass(frozen=True, kw_only=True)
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
    # Split-KV: programs an SM the chooser aims for (not tuned), and the fewest keys a split
    # is given: a split costs a partial state written and read back and the merge launch,
    # which a short chunk does not repay (a window of 128, alone or with 480 sparse keys, ran
    # slower in two splits than in one: benchmarks/results/2026-12-01-h200-baseline/).
    programs_per_sm: int = 2
    min_split_keys: int = 512
    # A visible key whose row cannot be read (a block-table entry off the cache, a pool
    # index off the pool) makes its query rows NaN either way, bit for bit: False reads
    # such a row as NaN (a select over each key tile: ops.decode._load_key), True reads it
    # as zeros and makes the state's l NaN (a [BLOCK_N] test a tile). Only the code differs,
    # and which is faster depends on the shape (True won on S and on C-A over fp8, lost on
    # C-A over bf16 and C-B over fp8: benchmarks/results/2026-12-03-h200-decode-unread-rows/).
    flag_unread: bool = False

    @property
    def carry(self):
        """Whether the window loop carries the next tile's block-table entries: with 3
        stages or more, where it buys the K/V copies a second buffer (ops.decode)."""
        return self.num_stages > 2

    def splits(self, batch, kv_heads, max_keys, sm_count):
        """Split-KV chunks per (sequence, KV head program): enough programs to fill
        ``programs_per_sm`` x ``sm_count`` SMs, never more than the key tiles one sequence
        can hold (``max_keys``: the window plus any sparse keys), so no split starts empty
        for a sequence that fills its window, and none gets fewer than ``min_split_keys``
        keys; at least 1."""
        programs = max(batch * kv_heads, 1)
        wanted = -(-self.programs_per_sm * sm_count // programs)
        tiles = -(-max(max_keys, 1) // self.block_n)
        return max(1, min(wanted, tiles, max_keys // self.min_split_keys))


def is_fp8(kv_dtype, dtype):
    """Whether a cache of ``kv_dtype`` beside queries of ``dtype`` is an fp8 one."""
    return kv_dtype is not None and kv_dtype != dtype and getattr(kv_dtype, "itemsize", 2) == 1


def decode_config(head_dim, head_dim_v, group, dtype, device, kv_dtype=None):
    """The decode kernel's tiles for a shape (fp16/bf16; fp32 takes the same tiles) and
    the cache's dtype ``kv_dtype`` (None: the queries').

    A program holds the query heads of one KV group as the rows of a tensor-core product
    (BLOCK_H, at least 16; rows past the group masked). On the GPU: d64 one 128-key tile
    (a window of 128 in one step), the sequence the grid's fastest axis; d128 64-key tiles
    in 2 stages with the head blocks fastest, four programs an SM, so a batch of 64 is one
    wave; heads wider than 256 (576/512 latent heads, keys as two products) 16 heads and
    32 keys a program. ``hopper``: on sm_90 windows of ``HopperDecodeConfig.min_keys`` keys
    or more and full attention at D = Dv in (64, 128) take the Gluon path instead, with its
    own tiles and split count (:func:`hopper_decode_config`). Why these tiles: the decode
    sweeps and runs of ``benchmarks/results/2026-12-01-h200-decode-double-buffer/``,
    ``2026-12-01-h200-decode-split-balance/`` and ``2026-12-01-h200-hopper-decode/``. An fp8
    cache at d128 takes 128-key tiles (a tile is half the bytes; faster on C-B:
    ``benchmarks/results/2026-12-02-h200-fp8/``).
    """
    fp8 = is_fp8(kv_dtype, dtype)
    block_h = dot_side(group)
    if getattr(device, "type", device) != "cuda":
        return DecodeConfig(block_h=block_h, block_n=16, num_warps=4, num_stages=1)
    width = max(head_dim, head_dim_v)
    if width > 256:
        return DecodeConfig(block_h=16, block_n=32, num_warps=4, num_stages=2, flag_unread=True)
    if width <= 64:
        return DecodeConfig(block_h=block_h, block_n=128, num_warps=4, num_stages=2, hopper=True,
                            flag_unread=fp8)
    if width <= 128:
        return DecodeConfig(block_h=block_h, block_n=128 if fp8 else 64, num_warps=4,
                            num_stages=2, heads_first=True, hopper=True)
    return DecodeConfig(block_h=block_h, block_n=32, num_warps=4, num_stages=2)


@dataclass(frozen=True, kw_only=True)
class HopperExtendConfig:
    """The Gluon extend path's tiling (ops.extend_hopper). 64 x 64 tiles under one
    warpgroup with two K/V stages keep two programs an SM (82 KB of shared memory at d128).
    Why these values: ``benchmarks/results/2026-12-01-h200-hopper-extend/``,
    ``2026-12-01-h200-hopper-loop/``, ``2026-12-01-h200-hopper-warp-specialized/`` and
    ``2026-12-01-h200-deterministic-gluon-probe/``."""

    block_m: int = 64  # new tokens a program, one query head
    block_n: int = 64  # keys a tile
    stages: int = 2  # K/V tiles in flight
    num_warps: int = 4  # one warpgroup
    # The grid's fastest axis is the query heads: a KV group's heads run the same block
    # side by side and share its K/V tiles in L2.
    heads_first: bool = True
    # The score products read the query tile from registers (d128 only: at d64 the load
    # into the operand layout computes wrong results; the kernel also checks).
    q_regs: bool = False
    # Windows of ws_min_window keys or more and full attention run warp-specialized: a
    # producer warp (producer_regs registers) loads the block table and issues the copies
    # while the warpgroup computes; ws_maxnreg registers a thread at launch keep two
    # programs an SM. Short windows, a few tiles long, run faster without.
    warp_specialize: bool = True
    ws_min_window: int = 1024
    ws_maxnreg: int = 128
    producer_regs: int = 24
    # Over an fp8 cache every launch is warp-specialized (but with prefix_rows, below),
    # with these converter warps (and registers) making the ring's tiles fp16 beside the
    # warpgroup.
    convert_warps: int = 2
    convert_regs: int = 56
    # Over an fp8 cache, opt-in: the products in fp8 (e4m3 query rows and weights against
    # the cache's K and V as stored; ops.extend_hopper), the converter transposing V only.
    fp8_products: bool = False
    # Over an fp8 cache under a window, the plan's choice (plan.extend): the window's visible
    # prefix widened to fp16 rows before the kernel (ops.cache.PrefixRowsLaunch), every tile
    # then copied as a 16-bit one.
    prefix_rows: bool = False

    def __post_init__(self):
        if self.block_m not in (64, 128) or self.num_warps != self.block_m // 16:
            raise ValueError("HopperExtendConfig: block_m must be 64 or 128 and num_warps "
                             "block_m // 16 (16 rows a warp), got "
                             f"block_m={self.block_m}, num_warps={self.num_warps}")

    def warp_specialized(self, bounds, window_left, fp8=False):
        """Whether a launch runs the warp-specialized loop: the tight bounds of long windows
        and full attention, and over an fp8 cache any launch but one whose window's prefix
        is widened before the kernel (``prefix_rows``: every tile then copied as a 16-bit
        one, and taken as a 16-bit launch would take it)."""
        return (fp8 and not self.prefix_rows) or (
            self.warp_specialize and bounds == "tight"
            and (window_left is None or window_left >= self.ws_min_window))

    def launch_options(self, ws):
        """The compile options of a launch (``ws``: warp-specialized, with the register
        limit that keeps two programs an SM)."""
        if ws:
            return {"num_warps": self.num_warps, "maxnreg": self.ws_maxnreg}
        return {"num_warps": self.num_warps}


# The Hopper extend path's 128-row tiling: two warpgroups under one query head share each
# K/V tile (half the copies, and over an fp8 cache half the widening, a query row), one
# program an SM (its registers: 168 a thread at launch). Not the default: slower than 64 rows
# on B over bf16 (the warpgroups meet at a barrier at each stage release), and over fp8 faster
# than 64 rows but still slower than bf16 (benchmarks/results/2026-12-02-h200-fp8-extend-products/).
HOPPER_EXTEND_128_ROWS = {"block_m": 128, "num_warps": 8, "ws_maxnreg": 168}


def hopper_extend_config(head_dim, dtype):
    """The Gluon extend path's tiling for a head dim (fp16 and bf16 share it; so does an fp8
    cache: a third ring stage, 112 KB at d128, ran no faster on B:
    ``benchmarks/results/2026-12-02-h200-fp8-hopper-extend/``)."""
    del dtype
    return HopperExtendConfig(q_regs=head_dim == 128)


@dataclass(frozen=True, kw_only=True)
class HopperDecodeConfig:
    """The Gluon decode path's tiling (ops.decode_hopper): the query heads of a KV group as
    the 64 rows of one warpgroup's product (over an fp8 cache 16 rows, mma.sync's, a larger
    group taking several programs), 64-key tiles (over fp8 128: two 64-key sub-tiles a
    stage) from a ring of ``num_stages`` stages filled by a producer warp. Why these
    values: ``benchmarks/results/2026-12-01-h200-hopper-decode/`` and
    ``benchmarks/results/2026-12-02-h200-fp8-decode-registers/``."""

    block_h: int = 64  # query-head rows a program (a group of up to 64; 16 over fp8)
    block_n: int = 64  # keys a tile
    num_stages: int = 2  # K/V ring stages
    num_warps: int = 4  # one warpgroup
    # 128 registers a thread at launch (by setmaxnreg the producer then takes producer_regs
    # and the warpgroup the rest: 232 beside 24, 216 beside 40), so the registers hold two
    # programs an SM.
    maxnreg: int = 128
    producer_regs: int = 24
    # The plan takes this path for windows of min_keys keys or more (and full attention):
    # ahead of the Triton kernel on C-B (4097 keys) and C-F, behind it on C-A (129 keys).
    min_keys: int = 1024
    # Over an fp8 cache: the work items (sequence, KV head, head block) a program takes one
    # after another, its ring running on across them (1 over a 16-bit cache); the plan
    # chooses it by items_for unless a config dict names it.
    items: int = 1
    # Programs an SM the path holds (its registers and shared memory), and the fewest keys
    # a split is given (as DecodeConfig's).
    programs_per_sm: int = 2
    min_split_keys: int = 512

    def splits(self, batch, kv_heads, max_keys, sm_count):
        """Split-KV chunks per (sequence, KV head): as many as still fit the programs in
        one wave (``programs_per_sm`` x ``sm_count``), at least 1, capped as
        DecodeConfig.splits caps them. A grid past one wave is left whole: its programs
        start wherever the first wave's end, which balanced the SMs better than shorter
        split programs and a merge (``benchmarks/results/2026-12-01-h200-hopper-decode/``)."""
        return one_wave_splits(self, batch, kv_heads, max_keys, sm_count)

    def items_for(self, programs, sm_count):
        """Work items a program over an fp8 cache, for a grid of ``programs`` of one item
        each: 2 where that grid is past one wave (``programs_per_sm`` x ``sm_count`` slots)
        and half of it still fills 95% of the slots, so a slot's second item runs on in the
        same program without its ring draining; else 1. On C-B (512 items, 264 slots) 2 beat
        1, and 3 and 4 lost (171 and 128 programs leave SMs with one warpgroup:
        ``benchmarks/results/2026-12-03-h200-fp8-decode-items/``)."""
        slots = self.programs_per_sm * sm_count
        return 2 if -(-programs // 2) >= 0.95 * slots else 1


@dataclass(frozen=True)
class LatentDecodeConfig:
    """The Gluon latent-cache decode path's tiling (ops.decode_latent): 64 query-head rows
    a program (two warpgroups' products, one program an SM: the query's 72 KB and two key
    buffers in shared memory), tiles of ``block_n`` keys, split-KV to fill the SMs."""

    # (the kernel's layouts are written for 64 head rows and 8 warps: not tunable)
    block_h: int = 64
    block_n: int = 32
    num_warps: int = 8
    programs_per_sm: int = 1
    min_split_keys: int = 128
    # The plan takes this path for groups of at least min_group query heads a KV head: at
    # S's sizes it beat the Triton kernel at 16 heads, over bf16 and fp8; smaller groups were
    # not measured (benchmarks/results/2026-12-04-h200-s-latent-gluon/).
    min_group: int = 16

    def splits(self, batch, kv_heads, max_keys, sm_count):
        """Split-KV chunks per (sequence, head block), as the Hopper decode path's: as many
        as fill ``programs_per_sm`` x ``sm_count`` SMs in one wave, none given fewer than
        ``min_split_keys`` keys; at least 1."""
        return one_wave_splits(self, batch, kv_heads, max_keys, sm_count)


def one_wave_splits(config, batch, kv_heads, max_keys, sm_count):
    """The Gluon decode paths' split-KV chunks per (sequence, KV head or head block): as
    many as still fit ``config.programs_per_sm`` x ``sm_count`` programs in one wave, never
    more than a sequence's key tiles (``config.block_n`` keys each) nor than leave a split
    fewer than ``config.min_split_keys`` keys; at least 1."""
    programs = max(batch * kv_heads, 1)
    wanted = config.programs_per_sm * sm_count // programs
    tiles = -(-max(max_keys, 1) // config.block_n)
    return max(1, min(wanted, tiles, max_keys // config.min_split_keys))


def hopper_decode_config(head_dim, dtype, kv_dtype=None):
    """The Gluon decode path's tiling for a head dim (fp16 and bf16 share it): 4 ring
    stages at d64, 2 at d128, two programs an SM either way (82 KB / 74 KB of shared
    memory with the query tile). Over an fp8 cache (``kv_dtype`` of one byte) 16 query
    rows a program and 2 stages of 128-key tiles (64 KB at d128, with the warps' merge
    still two programs an SM; faster on C-B than 4 stages of 64 keys:
    ``benchmarks/results/2026-12-02-h200-fp8-decode-pipeline/``), the producer
    holding 40 registers for a tile's 8 page entries at pages of 16 (at 32 its code used
    16 bytes of stack: at d64 always, at d128 once the warpgroup's loop was shortened)."""
    if is_fp8(kv_dtype, dtype):
        return HopperDecodeConfig(block_h=16, block_n=128, num_stages=2, producer_regs=40)
    return HopperDecodeConfig(num_stages=4 if head_dim <= 64 else 2)


def head_blocking(config, group):
    """``(BLOCK_H, head blocks)``: the query heads of a KV group in blocks of BLOCK_H rows
    (at least 16, tl.dot's smallest side; a power of two), one program each; the Hopper
    decode path's blocks are its config's rows, whatever the group."""
    if isinstance(config, (HopperDecodeConfig, LatentDecodeConfig)):
        return config.block_h, -(-group // config.block_h)
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


# SM count assumed off the GPU, where the interpreter runs one program at a time.
DECODE_CPU_SMS = 2


def second_keys_config(head_dim, head_dim_v, group, dtype, device, kv_dtype=None):
    """The second-source kernel's tiling (ops.decode's ``_second_keys_kernel``): the decode
    kernel's, with key tiles of 16 for wide heads (DeepSeek's 512 and 576 columns), which keep
    its registers within the file where tiles of 32 spill (tests/test_asm.py)."""
    cfg = decode_config(head_dim, head_dim_v, group, dtype, device, kv_dtype)
    return replace(cfg, block_n=16) if head_dim > 256 else cfg
