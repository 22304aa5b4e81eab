"""Tile and launch configs: pure functions of the shape (tested without a GPU)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    pack_gqa: bool = False


# Every tiling extend_config can return; tests and `swattn verify` walk all of them.
EXTEND_TILINGS = ((128, 64), (64, 64), (32, 64), (16, 16))


def packs_gqa(config, group):
    """Whether a launch packs the query heads of a KV group into the rows of a block: asked
    for, a group of 2 or more, a power of two, and at most BLOCK_M / 2 so a block still
    holds two tokens."""
    return (config.pack_gqa and group > 1 and group & (group - 1) == 0
            and 2 * group <= config.block_m)


def extend_config(head_dim, head_dim_v, group, dtype, device):
    """(BLOCK_M, BLOCK_N, warps, stages) of the two-stage kernel.

    On the GPU the tile shrinks as the head grows so q, the accumulator and one K/V tile
    stay in registers (H200 choice; see benchmarks/results for the measurements). The
    interpreter runs small tiles: its cost grows with tile area, not launch count.
    """
    if getattr(device, "type", device) != "cuda":
        return Config(16, 16, 4, 1)
    width = max(head_dim, head_dim_v)
    if width <= 64:
        return Config(128, 64, 4, 2)
    if width <= 128:
        return Config(128, 64, 8, 2)
    if width <= 256:
        return Config(64, 64, 8, 2)
    return Config(32, 64, 8, 1)
