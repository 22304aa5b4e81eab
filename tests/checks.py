"""Assertions the kernel tests share: bounds variants bit-identical, results against the
reference (outputs by relative error, lse -inf exactly where the reference's is); and two
runners: a script compiled in a fresh process, a launch replayed from a CUDA graph."""

import os
import subprocess
import sys

import torch

from swattn.verify.cases import rel_err

TOL = 5e-3  # fp16 inputs, fp32 accumulation, against float64


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def assert_bounds_identical(results):
    """Every variant's outputs equal the first's, bit for bit."""
    for other in results[1:]:
        for a, b in zip(as_tuple(results[0]), as_tuple(other)):
            assert torch.equal(a, b), "bounds variants differ"
    return results[0]


def assert_matches_reference(got, want, tol=TOL, lse_tol=1e-2):
    """No NaN; outputs within ``tol`` relative error; lse -inf where the reference's is and
    within ``lse_tol`` elsewhere."""
    for g, w in zip(as_tuple(got), as_tuple(want)):
        assert not torch.isnan(g).any()
        if g.dtype == torch.float32 and g.dim() == 2:  # lse: -inf where nothing is visible
            assert torch.equal(torch.isinf(g), torch.isinf(w))
            fin = torch.isfinite(w)
            if fin.any():
                assert (g[fin].double() - w[fin].double()).abs().max().item() < lse_tol
        else:
            assert rel_err(g, w) < tol, rel_err(g, w)


def run_fresh(script, timeout=600, args=()):
    """``script`` run by a fresh Python without TRITON_INTERPRET (the sm_90 compiles: the
    interpreter never reaches the compiler), ``args`` its ``sys.argv[1:]``; the completed
    process, output captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def replay_after(launch, change, out):
    """``launch`` captured in a CUDA graph, then ``change()`` (inputs changed in place: the
    lengths), ``out`` poisoned with NaN and the graph replayed, as a serving engine does."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    change()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()


def runs_without_sync(run, out, times=3):
    """``run()``'s results, ``times`` times over ``out`` poisoned with NaN first, under
    torch.cuda.set_sync_debug_mode("error") (a host sync raises); compared by the caller
    outside it (a comparison syncs)."""
    results = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(times):
            out.fill_(float("nan"))
            results.append(run().clone())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return results


def latent_inputs(case, tensors, sparse):
    """A latent cache of the case: the values are the keys' first ``head_dim_v`` columns
    (``v_cache = k_cache[..., :Dv]``, the pool likewise), and the same values as their own
    copies: ``(latent, copied)``, each ``(v_cache, sparse)``."""
    dv = case.head_dim_v
    k_cache, (k_pool, _, idx) = tensors[1], sparse
    latent = (k_cache[..., :dv], (k_pool, k_pool[..., :dv], idx))
    return latent, (latent[0].clone(), (k_pool, latent[1][1].clone(), idx))
