"""Tests run on the CPU under Triton's interpreter unless a GPU is present; GPU-only tests
are marked ``gpu``. torch.empty is poisoned with NaN so a read of memory nothing wrote,
or an output element left unwritten, shows up."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

_empty = torch.empty


def _nan_empty(*args, **kwargs):
    t = _empty(*args, **kwargs)
    if t.is_floating_point():
        with torch.no_grad():
            t.fill_(float("nan"))
    return t


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", _nan_empty)


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=0,
                     help="the seed of the tests that take one "
                          "(other random inputs, the same checks)")


@pytest.fixture
def seed(request):
    return request.config.getoption("--seed")


@pytest.fixture(autouse=True)
def seed_generators(request):
    """Every test starts from generators seeded by ``--seed``: torch's global one (and
    CUDA's), Python's and NumPy's, so a draw a test did not seed itself repeats too."""
    import random

    import numpy

    base = request.config.getoption("--seed")
    torch.manual_seed(base)
    random.seed(base)
    numpy.random.seed(base)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_check.sh runs these)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# The peers' kernels as files (scripts/peers_path.sh, docs/peers.md), where they are here.
PEERS = os.path.join(os.path.dirname(__file__), os.pardir, ".peers", "py")


@pytest.fixture
def with_peers(monkeypatch):
    """The peers on sys.path, or a skip where .peers/py is absent."""
    import warnings

    if not os.path.isdir(os.path.join(PEERS, "sglang")):
        pytest.skip("no .peers/py here (docs/peers.md says what it holds)")
    monkeypatch.syspath_prepend(os.path.abspath(PEERS))
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # the interpreter's -inf - -inf
