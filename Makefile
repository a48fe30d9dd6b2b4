# reflex: `make demo` runs the main job, `make test` runs every test. Both work on a fresh machine
# with only the Rust toolchain and Python 3: they create ./.venv with the pinned Python peers
# (ONNX Runtime's shared library among them) on first use.

PYTHON ?= python3
VENV := .venv
CARGO ?= cargo

.PHONY: demo test venv build bench fmt clippy clean-venv models

## The pinned Python environment (onnxruntime, eclipse-zenoh, gymnasium, msgpack).
venv: $(VENV)/.installed

$(VENV)/.installed: tests/requirements.txt
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --disable-pip-version-check -q -r tests/requirements.txt
	@# The rerun CLI would report anonymous usage; nothing leaves this machine.
	@CI=1 $(VENV)/bin/rerun analytics disable > /dev/null 2>&1 || true
	@touch $@

build:
	$(CARGO) build --release

## The main job: the shipped base policy on the simulator, the residual SAC learner and a
## simulated person, in one process (docs/training.md). Writes runs/<run-id>/.
demo: venv build
	$(CARGO) run --release --quiet -- demo

## Every test: unit tests of every crate and the system tests (one release build profile).
test: venv
	$(CARGO) test --release --workspace

## Remake the shipped base policies in models/ (the exact commands and seeds are also recorded
## in each model's spec as `provenance`, and in docs/policies.md).
REFLEX := $(CARGO) run --release --quiet --
models: build
	rm -rf demos/pick demos/insert
	$(REFLEX) sim demos --task pick --episodes 30 --noise 0.2 --seed 1 --out demos/pick
	$(REFLEX) bc train --demos demos/pick --out models/pick.onnx --steps 2000 --seed 1
	$(REFLEX) sim demos --task insert --episodes 120 --noise 0.03 --seed 1 --out demos/insert
	$(REFLEX) bc train --demos demos/insert --out models/insert.onnx --steps 10000 --seed 1
	$(REFLEX) run --config configs/run/sim-pick-bc.toml --episodes 100
	$(REFLEX) run --config configs/run/sim-insert-bc.toml --episodes 100

bench: build
	$(CARGO) run --release --quiet -- sim bench --task pick
	$(CARGO) run --release --quiet -- bench bus

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

clean-venv:
	rm -rf $(VENV)
