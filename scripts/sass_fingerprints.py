"""The SASS fingerprints of the Triton kernels (swattn.verify.asm.fingerprints), compiled for
sm_90 on any machine (no GPU: Triton's ptxas). Run it on two trees and compare, to show a
change leaves the 16-bit kernels' code as it was:

    PYTHONPATH=src python3 scripts/sass_fingerprints.py before.json
    (change)
    PYTHONPATH=src python3 scripts/sass_fingerprints.py after.json --against before.json
"""

import argparse
import json
import sys

from swattn.verify import asm

parser = argparse.ArgumentParser()
parser.add_argument("out", help="JSON file for this tree's fingerprints")
parser.add_argument("--against", help="an earlier tree's JSON: exit 1 where a kernel differs")
args = parser.parse_args()
prints = asm.fingerprints(progress=lambda line: print(line, file=sys.stderr, flush=True))
with open(args.out, "w") as f:
    json.dump(prints, f, indent=1)
if args.against:
    with open(args.against) as f:
        before = json.load(f)
    changed = [name for name in prints if before.get(name) != prints[name]]
    print(f"{len(prints) - len(changed)} of {len(prints)} kernels' SASS identical"
          + (f"; differing: {', '.join(changed)}" if changed else ""))
    sys.exit(1 if changed else 0)
