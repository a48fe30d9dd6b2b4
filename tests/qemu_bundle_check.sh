#!/bin/sh
# Runs an aarch64 bundle on an x86_64 machine under qemu-user (`make bundle-check`): the binary's
# --version, `reflex doctor`, and a short run of the shipped pick policy on the bundle's own
# aarch64 ONNX Runtime against the simulator served by the host build over the bus (the robot's
# binary has no simulator: the way a robot meets one), then the same run on the host build.
# Needs (Debian): qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross, and root (a private
# mount namespace, below).
set -eu
export RUST_LOG=warn
checkout="$(pwd)"
tarball="${1:?usage: $0 dist/reflex-<release>-aarch64-unknown-linux-gnu.tar.gz}"
[ -f "$tarball" ] || { echo "$tarball not found: make bundle writes it" >&2; exit 1; }
command -v qemu-aarch64-static > /dev/null || {
    echo "qemu-aarch64-static not found: apt-get install qemu-user-static libc6-arm64-cross libstdc++6-arm64-cross" >&2
    exit 1
}
sysroot=/usr/aarch64-linux-gnu
[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] || {
    echo "$sysroot has no aarch64 C library: apt-get install libc6-arm64-cross libstdc++6-arm64-cross" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || { echo "run as root: the check replaces /proc/cpuinfo in a private mount namespace" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar xzf "$tarball" -C "$work"
b="$(echo "$work"/reflex-*)"
echo "== $(basename "$b"): $(du -sh "$tarball" | cut -f1) packed, $(du -sh "$b" | cut -f1) unpacked"
file "$b/bin/reflex" "$b"/lib/libonnxruntime.so.*

# qemu-user 7.2 (Debian 12) shows the program the host's /proc/cpuinfo. ONNX Runtime's CPU
# detection (pytorch/cpuinfo) parses it as an ARM one and crashes on the x86 text, so a
# Cortex-A72's (a Raspberry Pi 4's) takes its place, for this process tree only.
for i in 0 1; do
    printf 'processor\t: %s\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n' "$i"
done > "$work/cpuinfo"
aarch64() {
    unshare -m sh -c 'mount --bind "$0" /proc/cpuinfo && exec qemu-aarch64-static -L '"$sysroot"' "$@"' "$work/cpuinfo" "$@"
}

echo "== reflex --version (aarch64, qemu)"
aarch64 "$b/bin/reflex" --version
echo "== reflex doctor (aarch64, qemu)"
aarch64 "$b/bin/reflex" doctor | tee "$work/doctor.txt" || true
grep -q "found via the bundle's lib/" "$work/doctor.txt" || { echo "doctor did not use the bundle's ONNX Runtime" >&2; exit 1; }
grep -q "ONNX Runtime loads: ok" "$work/doctor.txt" || { echo "the aarch64 ONNX Runtime did not load" >&2; exit 1; }

host="${REFLEX_HOST:-${CARGO_TARGET_DIR:-target}/release/reflex}"
host_ort="$(ls "$checkout"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2> /dev/null | head -n 1)"
[ -x "$host" ] && [ -n "$host_ort" ] || { echo "the host build ($host) and make venv's ONNX Runtime serve the simulator: run make build venv" >&2; exit 1; }
summary() {
    python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); print("%d episodes, success %.0f%%, mean return %.2f, %.1f steps per episode" % (v["episodes"], 100 * v["success_rate"], v["mean_return"], v["mean_steps"]))' "$1"
}
# configs/run/remote-pick.toml: robot `arm` on tcp/127.0.0.1:7457, lockstep, simulated time.
serve() {
    "$host" sim serve --task pick --robot arm --listen tcp/127.0.0.1:7457 --no-multicast > "$work/serve.log" 2>&1 &
    server=$!
    # The robot answers its spec once it is up; the actor's connect waits for it (timeout_ms).
}
echo "== reflex run, shipped pick policy, 10 episodes (aarch64, qemu; the simulator served by the host build)"
serve
start=$(date +%s.%N)
(cd "$b" && aarch64 ./bin/reflex run --config configs/run/remote-pick.toml --episodes 10 --json) > "$work/arm.json" || { kill $server; cat "$work/serve.log" >&2; exit 1; }
end=$(date +%s.%N)
kill $server; wait $server 2> /dev/null || true
echo "aarch64: $(summary "$work/arm.json"), $(python3 -c "print(round($end - $start, 1))") s under emulation"
serve
(cd "$b" && ORT_DYLIB_PATH="$host_ort" "$host" run --config configs/run/remote-pick.toml --episodes 10 --json) > "$work/host.json"
kill $server; wait $server 2> /dev/null || true
echo "x86_64 (the host build, same config and seeds): $(summary "$work/host.json")"
python3 - "$work/arm.json" << 'PY'
import json, sys
v = json.load(open(sys.argv[1]))
assert v["episodes"] == 10, v["episodes"]
PY
echo "== ok"
