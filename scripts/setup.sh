#!/usr/bin/env bash
# Set-up on a fresh machine (idempotent): a venv in .venv with the CPU torch build, Triton
# and swattn installed editable with its test and demo extras (transformers, rich). On a
# machine with a CUDA torch already in .venv, nothing is reinstalled.
#
# --newest: the same in .venv-newest, with the newest transformers the tests ran on (the
# test-newest extra) instead of the GPU image's pin; CI runs the integration tests there too.
# torch comes from the same local wheel and pip's cache, so this costs a copy, not a download.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv extras=test,demo
case "${1:-}" in
  "") ;;
  --newest) venv=.venv-newest extras=test-newest ;;
  *) echo "usage: bash scripts/setup.sh [--newest]" >&2; exit 2 ;;
esac
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c 'import torch, triton' 2>/dev/null; then
  "$venv/bin/pip" install -q torch==2.13.0 triton==3.6.0
fi
"$venv/bin/pip" install -q -e ".[$extras]"
