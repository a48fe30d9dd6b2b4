# reflex: `make demo` runs the main job, `make test` runs every test. Both work on a fresh machine
# with only the Rust toolchain and Python 3: they create ./.venv with the pinned Python peers
# (ONNX Runtime's shared library among them) on first use.

PYTHON ?= python3
VENV := .venv
CARGO ?= cargo

.PHONY: demo test venv build robot bench fmt clippy clean-venv models bundle bundle-check lerobot-tools parity lerobot-path

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

## Every test: unit tests of every crate and the system tests (one release build profile). The
## system test cpus:: reruns the learner as an AVX2-only processor under qemu-x86_64, which
## tests/other_cpu_setup.sh installs (Debian's qemu-user) when it is missing.
test: venv
	tests/other_cpu_setup.sh
	$(CARGO) test --release --workspace
	$(CARGO) test --release -p reflex-runtime --features loom --lib triple

## Remake the shipped base policies in models/ (the exact commands and seeds are also recorded
## in each model's spec as `provenance`; their rates in docs/bring-your-own-policy.md).
REFLEX := $(CARGO) run --release --quiet --
models: build
	rm -rf demos/pick demos/insert
	$(REFLEX) sim demos --task pick --episodes 30 --noise 0.2 --seed 1 --out demos/pick
	$(REFLEX) bc train --demos demos/pick --out models/pick.onnx --steps 2000 --seed 1
	$(REFLEX) sim demos --task insert --episodes 120 --noise 0.03 --seed 1 --out demos/insert
	$(REFLEX) bc train --demos demos/insert --out models/insert.onnx --steps 10000 --seed 1
	$(REFLEX) run --config configs/run/sim-pick-bc.toml --episodes 100
	$(REFLEX) run --config configs/run/sim-insert-bc.toml --episodes 100

## The robot's build for this machine (docs/deploy.md, "The robot build"): what `make bundle`
## cross-builds (`--no-default-features`: no simulator, trainers, dataset or video code,
## importer, emulator or benches), under $(CARGO_TARGET_DIR)/<host triple>/release so it never
## replaces the workstation binary the tests run. Prints its size and crate count.
HOST_TRIPLE := $(shell rustc -vV 2> /dev/null | sed -n 's/^host: //p')
robot:
	$(CARGO) build --release -p reflex --no-default-features --target $(HOST_TRIPLE)
	@bin="$(or $(CARGO_TARGET_DIR),target)/$(HOST_TRIPLE)/release/reflex"; \
	echo "robot build: $$bin, $$(du -m "$$bin" | cut -f1) MB, $$($(CARGO) tree --offline -e normal --prefix none -p reflex --no-default-features | sed 's/ (\*)//' | sort -u | wc -l) crates"

## The robot's bundle (docs/deploy.md): reflex cross-built for BUNDLE_TARGET with cargo-zigbuild
## (zig from PyPI, in .venv-tools), ONNX Runtime from the onnxruntime wheel of that platform,
## packed with the models, configs, systemd unit and install script by `reflex bundle` into
## dist/. It compiles the dependency tree a second time, for the target (28 min cold on 2 cores),
## so it is not part of `make test`; the install, upgrade and rollback tests use a host bundle.
## The robot's binary is built without the `bench` feature: no benchmarks, no soak, no workloads.
BUNDLE_TARGET ?= aarch64-unknown-linux-gnu
BUNDLE_ARCH := $(firstword $(subst -, ,$(BUNDLE_TARGET)))
BUNDLE_TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
ORT_VERSION := $(shell sed -n 's/^onnxruntime==//p' tests/requirements.txt)
ZIG_VERSION := 0.17.1
ZIGBUILD_VERSION := 0.24.1
TOOLS_VENV := .venv-tools
bundle: venv build
	rustup target add $(BUNDLE_TARGET)
	@test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install --disable-pip-version-check -q ziglang==$(ZIG_VERSION)
	@command -v cargo-zigbuild > /dev/null || $(CARGO) install --locked cargo-zigbuild --version $(ZIGBUILD_VERSION)
	@# cargo-zigbuild runs zig as `python3 -m ziglang` when no `zig` is on PATH.
	PATH="$(CURDIR)/$(TOOLS_VENV)/bin:$$PATH" CARGO_TARGET_DIR="$(BUNDLE_TARGET_DIR)" \
		$(CARGO) zigbuild --release --target $(BUNDLE_TARGET) -p reflex --no-default-features
	rm -rf .bundle-cache/ort && mkdir -p .bundle-cache/ort
	$(VENV)/bin/python -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
		--platform manylinux_2_28_$(BUNDLE_ARCH) --python-version 3.11 \
		onnxruntime==$(ORT_VERSION) -d .bundle-cache/ort
	$(VENV)/bin/python -m zipfile -e .bundle-cache/ort/onnxruntime-$(ORT_VERSION)-*.whl .bundle-cache/ort/wheel
	$(CARGO) run --release --quiet -- bundle --target $(BUNDLE_TARGET) \
		--binary "$(BUNDLE_TARGET_DIR)/$(BUNDLE_TARGET)/release/reflex" \
		--onnxruntime .bundle-cache/ort/wheel/onnxruntime/capi/libonnxruntime.so.$(ORT_VERSION) --out dist

## The aarch64 bundle on this x86_64 machine under qemu-user: --version, doctor and a short
## simulator run with the shipped policy on the bundle's own aarch64 ONNX Runtime.
bundle-check:
	tests/qemu_bundle_check.sh $(lastword $(sort $(wildcard dist/reflex-*-aarch64-unknown-linux-gnu.tar.gz)))

## The LeRobot tools environment (.venv-lerobot): LeRobot 0.6.1, torch (the CUDA build, the only
## one on the Python index: 5.2 GB installed, about 2 minutes to make here) and the test-suite's ONNX Runtime, pinned in
## policies/import/requirements.txt. `reflex policy import lerobot` exports checkpoints with it and
## makes it itself on first use, the same way. Not part of `make test`: it is too big for CI.
## LeRobot needs Python >= 3.12; LEROBOT_PYTHON picks the interpreter.
LEROBOT_VENV := .venv-lerobot
LEROBOT_PYTHON ?= $(shell for p in python3.12 python3.13 python3.14 $(wildcard $(HOME)/.pyenv/versions/3.1[234]*/bin/python3); do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' > /dev/null 2>&1 && { echo $$p; break; }; done)
lerobot-tools: $(LEROBOT_VENV)/requirements.txt

$(LEROBOT_VENV)/requirements.txt: policies/import/requirements.txt
	@test -n "$(LEROBOT_PYTHON)" || { echo "no Python >= 3.12 found (LeRobot 0.6 needs it): set LEROBOT_PYTHON=/path/to/python3.12"; exit 1; }
	@test -x $(LEROBOT_VENV)/bin/python || $(LEROBOT_PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/python -m pip install --disable-pip-version-check --progress-bar off -r policies/import/requirements.txt
	@# The copy marks the environment complete; `reflex policy import` compares it with its own.
	cp policies/import/requirements.txt $@

## Parity of imported LeRobot policies with LeRobot itself (policies/import/parity.py): for ACT,
## Diffusion Policy (LeRobot's defaults: two observation steps, DDPM 100; and one step with
## DDIM 10), SmolVLA (a reduced SmolVLM backbone made here: the hub is out of reach), pi0 and
## pi0.5 (LeRobot's variants redefined two layers deep: the published 3.3 B do not load in 24 GB), a
## checkpoint made with LeRobot's classes, imported by reflex, both run on the same observations
## (and the same noise, DDPM's per-step noise included); fails above 1e-4. Needs the tools environment above
## (made on first use), so it is its own target.
PARITY_REFLEX = "$(or $(CARGO_TARGET_DIR),target)/release/reflex"
parity: lerobot-tools build
	$(LEROBOT_VENV)/bin/python policies/import/parity.py --policy act --reflex $(PARITY_REFLEX)
	$(LEROBOT_VENV)/bin/python policies/import/parity.py --policy diffusion --observations 2 --warmup 0 --repeat 1 --reflex $(PARITY_REFLEX)
	$(LEROBOT_VENV)/bin/python policies/import/parity.py --policy diffusion --scheduler DDIM --n-obs-steps 1 --inference-steps 10 --observations 4 --reflex $(PARITY_REFLEX)
	$(LEROBOT_VENV)/bin/python policies/import/parity.py --policy smolvla --observations 4 --reflex $(PARITY_REFLEX)
	$(LEROBOT_VENV)/bin/python policies/import/parity.py --policy pi0 --observations 2 --warmup 0 --repeat 1 --reflex $(PARITY_REFLEX)
	$(LEROBOT_VENV)/bin/python policies/import/parity.py --policy pi05 --observations 2 --warmup 0 --repeat 1 --reflex $(PARITY_REFLEX)

## The whole path a LeRobot user takes (policies/import/user_path.py), each step the real program in
## its own process: reflex records demonstrations with cameras, exports them, LeRobot's
## LeRobotDataset loads them (checked against reflex's records), lerobot-train trains ACT on the
## CPU, reflex imports it, runs it on the simulator and refines it with the residual learner; and
## datasets written by LeRobot's own writer (AV1 and H.264) train in `reflex bc train`. Small
## sizes, a few minutes; its own target for the same reason as `parity`.
lerobot-path: lerobot-tools build
	$(LEROBOT_VENV)/bin/python policies/import/user_path.py --reflex $(PARITY_REFLEX)

bench: build
	$(CARGO) run --release --quiet -- sim bench --task pick
	$(CARGO) run --release --quiet -- bench bus

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

clean-venv:
	rm -rf $(VENV)
