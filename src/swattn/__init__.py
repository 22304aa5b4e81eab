"""swattn: sliding-window attention kernels in Triton with a PyTorch front.

Public API only; see DESIGN.md section 3 for the contract of each function.
"""

from . import window
from .api import extend_attention

__all__ = ["extend_attention", "window"]
