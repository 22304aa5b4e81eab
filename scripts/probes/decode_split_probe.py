"""Probe (not part of the library): what two-way split-KV costs and could save on WORKLOAD
(default C-B). Variants, each (BLOCK_N, warps, stages) in 2 splits, timed beside the
library's default and FlashInfer as decode_probe.py times them:

- ``even``: two halves of the key tiles, the library's merge kernel;
- ``no merge``: the same kernel without the merge launch (a wrong output, kept only for
  its time: the most that merging inside the kernel could save);
- ``first F``: split 0 takes the fraction F of the tiles (SPLIT0, e.g. "[0.6, 0.67]"):
  the programs of the second wave, which start as the first wave's end, are shorter, so
  their spread of end times (the kernel's tail) is too; ``first F no merge`` both;
  ``first F fused``: the merge inside the kernel instead (each split counts itself in
  once its part is stored; the last of a (sequence, head block) merges and resets the
  count).

    export PYTHONPATH=src; python3 scripts/probes/decode_split_probe.py
"""

import ast
import importlib.util
import os
import tempfile

import decode_probe  # scripts/probes, on sys.path as the script's folder
import torch

from swattn.bench import harness
from swattn.ops import decode

CONFIGS = [(64, 4, 2)]
CHUNKING = """    per_split = (total_tiles + num_splits - 1) // num_splits
    t_start = tl.minimum(i_split * per_split, total_tiles)
    t_stop = tl.minimum(t_start + per_split, total_tiles)
"""
MERGE = "    if parts is not None:\n        # [B, Hq, S, Dv]"
NO_MERGE = (MERGE, MERGE.replace("not None", "not None and False"))


def edited(name, edits):
    """``ops/decode.py`` with ``edits`` ((old, new) pairs) loaded as ``swattn.ops.<name>``."""
    with open(decode.__file__) as f:
        src = f.read()
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"swattn.ops.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The merge inside the kernel: each split counts itself in when its partial is stored; the
# last of a (sequence, head block) merges the parts (both loaded at once) and resets the count.
FUSED = [
    ("""        tl.store(Part_lse + i_seq * stride_plb + head * stride_plh + i_split, lse, mask=m_h)
""", """        tl.store(Part_lse + i_seq * stride_plb + head * stride_plh + i_split, lse, mask=m_h)
        tl.debug_barrier()
        p_count = Counter + tl.program_id(0)
        count = tl.atomic_add(p_count, 1, sem="acq_rel", scope="gpu")
        if count == num_splits - 1:
            tl.atomic_xchg(p_count, 0, sem="relaxed", scope="gpu")
            p_l = Part_lse + i_seq * stride_plb + head * stride_plh
            p_p = Part_o + i_seq * stride_pb + head[:, None] * stride_ph + o_dv[None, :]
            mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
            for s in tl.static_range(2):
                mx = tl.maximum(mx, tl.load(p_l + s, mask=m_h, other=float("-inf"), cache_modifier=".cg"))
            m_safe = tl.where(mx == float("-inf"), 0.0, mx)
            l_sum = tl.zeros([BLOCK_H], tl.float32)
            o_sum = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
            for s in tl.static_range(2):
                l_s = tl.load(p_l + s, mask=m_h, other=float("-inf"), cache_modifier=".cg")
                w = tl.exp(l_s - m_safe)
                o_s = tl.load(p_p + s * stride_ps, mask=(m_h & (l_s > float("-inf")))[:, None] & m_dv[None, :], other=0.0, cache_modifier=".cg")
                l_sum += w
                o_sum += w[:, None] * o_s
            denom = l_sum
            if HAS_SINKS:
                denom = l_sum + tl.exp(tl.load(sinks + head, mask=m_h, other=0.0) - m_safe)
            o = tl.where(l_sum[:, None] > 0.0, o_sum / denom[:, None], 0.0)
            tl.store(Out + i_seq * stride_ob + head[:, None] * stride_oh + o_dv[None, :], o.to(Out.dtype.element_ty), mask=m_h[:, None] & m_dv[None, :])
"""),
    ("    Part_o, Part_lse,\n    stride_qb", "    Part_o, Part_lse, Counter,\n    stride_qb"),
    ("Part_o=part_o, Part_lse=part_lse,", "Part_o=part_o, Part_lse=part_lse, Counter=COUNTER,"),
    NO_MERGE,
]


def first_fraction(f, merge="merge"):
    """Split 0 takes the fraction ``f`` of the tiles (0.5: the kernel's equal splits);
    ``merge``: "merge" (the kernel's), "none" or "fused"."""
    per_mille = round(f * 1000)
    edits = [] if f == 0.5 else [(CHUNKING, f"""    first = (total_tiles * {per_mille} + 999) // 1000
    t_start = tl.where(i_split == 0, 0, first)
    t_stop = tl.where(i_split == 0, first, total_tiles)
""")]
    edits += {"merge": [], "none": [NO_MERGE], "fused": FUSED}[merge]
    return edited(f"decode_first{per_mille}_{merge}", edits)


def main():
    rounds, reps = int(os.environ.get("ROUNDS", "2")), int(os.environ.get("REPS", "15"))
    configs = ast.literal_eval(os.environ["CONFIGS"]) if os.environ.get("CONFIGS") else CONFIGS
    fractions = ast.literal_eval(os.environ.get("SPLIT0", "[0.6, 0.67]"))
    case, inputs, config = decode_probe.setup()
    modules = [("even", first_fraction(0.5)), ("no merge", first_fraction(0.5, "none"))]
    modules += [(f"first {f}", first_fraction(f)) for f in fractions if f != 0.5]
    modules += [(f"first {f} no merge", first_fraction(f, "none")) for f in fractions]
    modules += [(f"first {f} fused", first_fraction(f, "fused")) for f in fractions]
    replays, outs, keep = {}, {}, []
    launch, out = decode_probe.prepare(decode, inputs, case, config, None)
    replays["default"], outs["default"] = harness.capture(launch)[0], out
    replays["default (control)"] = harness.capture(launch)[0]
    keep.append(launch)
    for variant in configs:
        cfg = decode_probe.with_config(config, variant)
        for label, module in modules:
            # The fused merge's counts: one a program of a split, all 0 between launches.
            module.COUNTER = torch.zeros(case.batch * case.num_kv_heads, dtype=torch.int32,
                                         device="cuda")
            keep.append(module.COUNTER)
            launch, out = decode_probe.prepare(module, inputs, case, cfg, 2)
            name = f"{variant} 2 splits {label}"
            replays[name], outs[name] = harness.capture(launch)[0], out
            keep.append(launch)
            if "no merge" not in label:
                diff = (out.float() - outs["default"].float()).abs().max().item()
                print(f"{name}: max diff to the default {diff:.1e}", flush=True)
    decode.CARRY_PAGES = None
    decode_probe.add_flashinfer(inputs, replays, outs, keep)
    times, errors, floor, _ = decode_probe.time_all(replays, reps, rounds, "default")
    decode_probe.print_times(case, rounds, reps, floor, times, errors, "default")


if __name__ == "__main__":
    main()
