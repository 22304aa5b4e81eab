"""swattn: sliding-window attention kernels in Triton with a PyTorch front.

Public API only; see DESIGN.md section 3 for the contract of each function. The kernels
(and torch) load on first use, so ``swattn.window`` and the ``swattn tiles``/``prove``
commands start without them.
"""

from . import window

_API = ("extend_attention", "decode_attention", "merge_states", "write_kv")
__all__ = [*_API, "window"]


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'swattn' has no attribute {name!r}")
