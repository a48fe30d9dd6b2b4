#!/usr/bin/env bash
# Runs reflex's learner benchmark and the SBX (JAX) peer on this machine, one after the other.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-peers
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -r benches/peers/requirements.txt
echo "== reflex"
cargo run --release --quiet -- bench learner --json "$@"
echo "== sbx (jax)"
"$VENV/bin/python" benches/peers/sbx_bench.py
