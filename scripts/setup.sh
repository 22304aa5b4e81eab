#!/usr/bin/env bash
# Set-up on a fresh machine (idempotent): a venv in .venv with the CPU torch build, Triton
# and swattn installed editable with its test and demo extras (transformers, rich). On a
# machine with a CUDA torch already in .venv, nothing is reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c 'import torch, triton' 2>/dev/null; then
  .venv/bin/pip install -q torch==2.13.0 triton==3.6.0
fi
.venv/bin/pip install -q -e '.[test,demo]'
