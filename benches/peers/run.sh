#!/usr/bin/env bash
# reflex's learner beside SBX (JAX) in one invocation: alternating runs in fresh processes,
# medians and ratios (compare.py). Installs the peer into ./.venv-peers on first use (jax,
# stable-baselines3 and torch: about 1 GB). Extra arguments go to compare.py, e.g. --reps 5.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-peers
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -r benches/peers/requirements.txt
# The same shared target directory as .ci/run when this machine keeps one (a cold release build
# inside the clone takes ~25 min on 2 cores).
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ -d /work/cargo-target ]; then
    export CARGO_TARGET_DIR=/work/cargo-target
fi
cargo build --release --quiet
REFLEX="${CARGO_TARGET_DIR:-target}/release/reflex"
"$VENV/bin/python" benches/peers/compare.py --reflex "$REFLEX" "$@"
