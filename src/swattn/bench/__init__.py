"""Benchmarks: named workloads, the peers as their engines call them, interleaved timing
with a same-variant control, and reports against the measured roofline (docs/design.md).

``python -m swattn.bench --workload A,B,C-A,C-B,S --out DIR`` runs the extend workloads
and the decode ones (:func:`swattn.bench.cli.main`). Nothing here is imported by the
kernels.
"""

from . import workloads
from .workloads import WORKLOADS, Case, Workload, extend_cases

__all__ = ["WORKLOADS", "Case", "Workload", "extend_cases", "workloads"]
