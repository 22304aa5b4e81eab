"""swattn: sliding-window attention kernels in Triton with a PyTorch front.

Public API only: the one-shot functions, the plans (plan once per batch, run per layer) and
the window conventions; docs/api.md says what each takes and promises. The kernels
(and torch) load on first use, so ``swattn.window`` and the ``swattn tiles``/``prove``
commands start without them.
"""

from . import window

__version__ = "0.1.0"

_API = ("extend_attention", "decode_attention", "merge_states", "write_kv")
_PLAN = ("plan_extend", "plan_decode", "ExtendPlan", "DecodePlan", "plan_second_keys",
         "SecondKeysPlan", "SecondKeys")
__all__ = [*_API, *_PLAN, "window", "__version__"]


def __dir__():
    """The public API (loaded lazily: listed here for autocompletion and ``dir``)."""
    return sorted(__all__)


def __getattr__(name):
    if name in _API:
        from . import api as module
    elif name in _PLAN:
        from . import plan as module
    else:
        raise AttributeError(f"module 'swattn' has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)  # the next look-up is a plain one
    return value
