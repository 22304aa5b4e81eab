"""Checkers of the kernels: the exhaustive bound prover (:mod:`swattn.verify.prove`),
and beside it the bit-identity matrix and the assembly comparison.

Nothing is imported here, so ``swattn prove`` loads numpy and the window math only.
"""
