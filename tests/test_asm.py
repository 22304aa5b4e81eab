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


PRODUCTS = """
import re
from swattn.verify import asm
for dtype, tensor_cores in (("bf16", True), ("fp32", False)):
    sass = asm.compile_decode(64, 8, True, dtype).sass
    mma = [i for i in sass if re.match(r"(@!?U?P\\d+ )?HG?MMA\\.", i)]
    assert bool(mma) == tensor_cores, (dtype, mma[:2])
print("ok")
"""


def test_fp32_products_run_in_fp32():
    """fp32 operands multiply on the FMA units (no TF32 tensor-core product in the SASS);
    bf16 ones on the tensor cores."""
    result = run_fresh(PRODUCTS)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok" in result.stdout


SECOND = """
import torch
from swattn.ops import config
from swattn.verify import asm
for d in (512, 576):
    cfg = config.second_keys_config(d, 512, 64, torch.bfloat16, torch.device("cuda"))
    block_h, _ = config.head_blocking(cfg, 64)
    for kw in ({}, {"indexed": False}, {"rows": True}, {"kv_dtype": "fp8e4nv"}):
        c = asm.compile_second_keys(head_dim=d, block_h=block_h, block_n=cfg.block_n, **kw)
        assert c.stack == 0 and c.local == 0, (d, kw, c.registers, c.stack, c.local)
        print(d, kw, c.registers)
print("ok")
"""


def test_second_keys_kernel_compiles_without_spills():
    """DeepSeek-V4's shape (64 query heads on one KV head of 512 columns; 576 as MLA's),
    the tiling its plans take on a GPU: no stack frame, no local memory, for each mode."""
    result = run_fresh(SECOND)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok" in result.stdout
FINGERPRINTS = """
import json, sys
from swattn import cli
from swattn.verify import asm
# One decode kernel stands for the whole list: the command's plumbing, a real compile.
asm.fingerprint_kernels = lambda: [("decode d64", lambda: asm.compile_decode(64, 8, True, "bf16"))]
path = sys.argv[1]
assert cli.main(["verify", "--asm", "--fingerprints", path]) == 0
assert cli.main(["verify", "--asm", "--against", path]) == 0
with open(path) as f:
    before = json.load(f)
assert before["decode d64"].endswith(" registers"), before
before["decode d64"] = "another tree's digest"
with open(path, "w") as f:
    json.dump(before, f)
assert cli.main(["verify", "--asm", "--against", path]) == 1
"""


def test_fingerprints_compare_two_trees(tmp_path):
    """swattn verify --asm --fingerprints FILE writes each kernel's SASS digest; --against
    FILE says how many are identical and exits 1 naming the one that differs."""
    result = run_fresh(FINGERPRINTS, args=[str(tmp_path / "before.json")])
    assert result.returncode == 0, result.stderr[-2000:]
    identical, changed = [line for line in result.stdout.splitlines() if "SASS identical" in line]
    assert identical == "1 of 1 kernels' SASS identical"
    assert changed == "0 of 1 kernels' SASS identical; differing: decode d64"
