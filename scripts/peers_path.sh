# Sourced on the GPU machine (scripts/gpu_check.sh): puts the peers on PYTHONPATH.
# .peers/py holds the SGLang and vLLM kernel files; FlashInfer travels as .peers/fi
# (docs/peers.md), unpacked here once; it JIT-compiles its kernels with the machine's nvcc
# on first use.
if [[ -f .peers/fi/flashinfer_slim.tar.gz && ! -d /tmp/fi/flashinfer_slim ]]; then
  mkdir -p /tmp/fi && tar xzf .peers/fi/flashinfer_slim.tar.gz -C /tmp/fi &&
    python3 -m pip install -q --no-index --no-deps --target /tmp/fi/site .peers/fi/apache_tvm_ffi-*.whl
fi
if [[ -d /tmp/fi/flashinfer_slim ]]; then
  export PYTHONPATH="/tmp/fi/flashinfer_slim:/tmp/fi/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/.peers/py${PYTHONPATH:+:$PYTHONPATH}"
