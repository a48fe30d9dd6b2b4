#!/bin/sh
# reflex's installer, shipped in every bundle (`reflex bundle`, `make bundle`).
#
#   sudo ./install.sh              install this bundle, or upgrade to it
#   sudo ./install.sh --rollback   go back to the release before (again: forward)
#   ./install.sh --root DIR        the same into DIR, a system root (an image being built, a
#                                  test): no systemctl calls, no architecture check
#
# What it does: copies the bundle to /opt/reflex/releases/<version>, points /opt/reflex/current
# at it and /opt/reflex/previous at the release it replaces (older releases are removed), creates
# the service user `reflex` (groups dialout and video), /etc/reflex (robot.toml from the bundle's
# example when there is none; an existing one is never touched), /var/lib/reflex for recordings
# and checkpoints, and installs and enables the systemd unit. A running service is restarted on
# the new release. Running it twice changes nothing the second time. docs/deploy.md has the rest.
set -eu

ROOT=""
ROLLBACK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT="${2:?--root needs a directory}"; shift 2 ;;
        --root=*) ROOT="${1#--root=}"; shift ;;
        --rollback) ROLLBACK=1; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument \`$1\` (--help lists them)" >&2; exit 2 ;;
    esac
done
ROOT="${ROOT%/}"

HERE="$(cd "$(dirname "$0")" && pwd)"
BASE="$ROOT/opt/reflex"
ETC="$ROOT/etc/reflex"
DATA="$ROOT/var/lib/reflex"
UNITS="$ROOT/etc/systemd/system"

say() { echo "reflex install: $*"; }
die() { echo "reflex install: error: $*" >&2; exit 1; }
live() { [ -z "$ROOT" ]; }
# systemctl only on the running system, and only when systemd is what runs it.
have_systemd() { live && [ -d /run/systemd/system ] && command -v systemctl > /dev/null; }

if [ "$(id -u)" != 0 ]; then
    die "run as root (sudo $0): it creates the service user and sets owners, under --root too"
fi
if [ -n "$ROOT" ] && [ ! -f "$ROOT/etc/passwd" ]; then
    die "$ROOT/etc/passwd not found: --root must be a system root (the service user is created there)"
fi

# Atomic symlink switch: a new link under a temporary name, renamed over the old one.
relink() {
    ln -sfn "$2" "$BASE/.$1.new"
    mv -T "$BASE/.$1.new" "$BASE/$1"
}
link_of() { readlink "$BASE/$1" 2> /dev/null || true; }

restart_if_running() {
    if have_systemd && systemctl is-active --quiet reflex.service; then
        systemctl restart reflex.service
        say "restarted reflex.service on $(basename "$(link_of current)")"
    fi
}

if [ "$ROLLBACK" = 1 ]; then
    cur="$(link_of current)"
    prev="$(link_of previous)"
    [ -n "$prev" ] && [ -d "$BASE/$prev" ] || die "no previous release under $BASE to roll back to"
    relink current "$prev"
    relink previous "$cur"
    say "rolled back: current is $(basename "$prev") (was $(basename "$cur"); --rollback again returns to it)"
    restart_if_running
    exit 0
fi

field() { sed -n "s/^$1 = \"\\(.*\\)\"\$/\\1/p" "$HERE/VERSION" 2> /dev/null; }
VERSION="$(field version)"
TARGET="$(field target)"
[ -n "$VERSION" ] && [ -n "$TARGET" ] || die "$HERE/VERSION names no version and target: is this an unpacked reflex bundle?"
(cd "$HERE" && sha256sum --quiet --strict -c SHA256SUMS) \
    || die "files in $HERE differ from its SHA256SUMS: the bundle is damaged; unpack it again"
if live; then
    machine="$(uname -m)"
    case "$TARGET" in
        "$machine"-*) ;;
        *) die "this bundle is for $TARGET, this machine is $machine: make a bundle for it (make bundle BUNDLE_TARGET=$machine-unknown-linux-gnu)" ;;
    esac
fi

# 1. The release, copied whole under a temporary name and renamed into place.
REL="releases/$VERSION"
mkdir -p "$BASE/releases"
if [ -d "$BASE/$REL" ] && (cd "$BASE/$REL" && sha256sum --quiet --strict -c SHA256SUMS) > /dev/null 2>&1; then
    say "release $VERSION is already in $BASE/$REL"
else
    rm -rf "$BASE/$REL.tmp"
    mkdir -p "$BASE/$REL.tmp"
    cp -a "$HERE/." "$BASE/$REL.tmp/"
    rm -rf "$BASE/$REL"
    mv "$BASE/$REL.tmp" "$BASE/$REL"
    say "release $VERSION copied to $BASE/$REL"
fi
CHANGED=0
cur="$(link_of current)"
if [ "$cur" != "$REL" ]; then
    CHANGED=1
    if [ -n "$cur" ]; then
        relink previous "$cur"
    fi
    relink current "$REL"
    say "current: $VERSION${cur:+ (previous: $(basename "$cur"), sudo $BASE/current/install.sh --rollback returns to it)}"
else
    say "current is already $VERSION"
fi
# Only the release in use and the one before it are kept.
keep_cur="$(link_of current)"
keep_prev="$(link_of previous)"
for d in "$BASE"/releases/*; do
    [ -e "$d" ] || continue
    r="releases/$(basename "$d")"
    if [ "$r" != "$keep_cur" ] && [ "$r" != "$keep_prev" ]; then
        rm -rf "$d"
        say "removed old release $(basename "$d")"
    fi
done

# 2. The service user, in the groups that open serial ports and cameras.
R=""
if [ -n "$ROOT" ]; then R="--root=$ROOT"; fi
has_group() { grep -q "^$1:" "$ROOT/etc/group"; }
for g in dialout video; do
    if ! has_group "$g"; then
        groupadd $R --system "$g"
        say "created group $g"
    fi
done
if ! grep -q '^reflex:' "$ROOT/etc/passwd"; then
    command -v useradd > /dev/null || die "useradd not found: create a system user \`reflex\` in the groups dialout and video, then run this again"
    useradd $R --system --user-group --home-dir /var/lib/reflex --no-create-home \
        --shell /usr/sbin/nologin --groups dialout,video reflex
    say "created system user reflex (groups dialout, video)"
else
    for g in dialout video; do
        if ! grep "^$g:" "$ROOT/etc/group" | grep -q '[:,]reflex\(,\|$\)'; then
            usermod $R -a -G "$g" reflex
            say "added reflex to group $g"
        fi
    done
fi
uid="$(awk -F: '$1 == "reflex" { print $3 }' "$ROOT/etc/passwd")"
gid="$(awk -F: '$1 == "reflex" { print $4 }' "$ROOT/etc/passwd")"

# 3. Configuration (kept across upgrades) and data.
install -d -m 755 "$ETC" "$ETC/calibration"
install -d -m 750 -o 0 -g "$gid" "$ETC/keys"
install -d -m 750 -o "$uid" -g "$gid" "$DATA" "$DATA/recordings"
if [ ! -e "$ETC/robot.toml" ]; then
    install -m 644 "$BASE/$REL/configs/deploy/robot.toml" "$ETC/robot.toml"
    say "wrote $ETC/robot.toml from the bundle's example: set the arm's port, calibration and the bus"
elif ! cmp -s "$BASE/$REL/configs/deploy/robot.toml" "$ETC/robot.toml"; then
    install -m 644 "$BASE/$REL/configs/deploy/robot.toml" "$ETC/robot.toml.example"
    say "kept $ETC/robot.toml; this release's example is $ETC/robot.toml.example"
fi
for f in "$BASE/$REL"/calibration/*.json; do
    [ -e "$f" ] || continue
    if [ ! -e "$ETC/calibration/$(basename "$f")" ]; then
        install -m 644 "$f" "$ETC/calibration/"
        say "calibration $(basename "$f") installed to $ETC/calibration"
    fi
done

# 4. ONNX Runtime on a Jetson: the CUDA/TensorRT build, when JetPack's is installed.
if [ -e "$ROOT/etc/nv_tegra_release" ]; then
    py="${REFLEX_PYTHON:-python3}"
    capi="$("$py" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))' 2> /dev/null || true)"
    gpu_lib=""
    if [ -n "$capi" ] && [ -e "$capi/libonnxruntime_providers_cuda.so" ]; then
        gpu_lib="$(ls "$capi"/libonnxruntime.so* 2> /dev/null | awk '{ print length, $0 }' | sort -n | tail -n 1 | cut -d' ' -f2-)"
    fi
    if [ -n "$gpu_lib" ]; then
        case "$gpu_lib" in
            /home/*|/root/*) say "warning: $gpu_lib is in a home directory, which the service cannot read (ProtectHome): install onnxruntime-gpu system-wide (sudo pip3 install ...)" ;;
        esac
        trt="CUDA"
        if [ -e "$capi/libonnxruntime_providers_tensorrt.so" ]; then trt="CUDA and TensorRT"; fi
        env_file="$ETC/reflex.env"
        touch "$env_file"
        if ! grep -qx "ORT_DYLIB_PATH=$gpu_lib" "$env_file"; then
            grep -v '^ORT_DYLIB_PATH=' "$env_file" > "$env_file.new" || true
            echo "ORT_DYLIB_PATH=$gpu_lib" >> "$env_file.new"
            mv "$env_file.new" "$env_file"
        fi
        say "Jetson: the service uses ONNX Runtime with $trt from $gpu_lib ($env_file)"
    else
        say "Jetson ($(head -n 1 "$ROOT/etc/nv_tegra_release" | cut -c1-60)) without a CUDA build of ONNX Runtime: the policy runs on the bundle's CPU library. For CUDA and TensorRT:"
        say "  1. JetPack's CUDA, cuDNN and TensorRT: sudo apt install nvidia-jetpack"
        say "  2. onnxruntime-gpu built for the JetPack (JetPack 6: sudo pip3 install onnxruntime-gpu --index-url https://pypi.jetson-ai-lab.io/jp6/cu126), version 1.31 or newer"
        say "  3. this script again: it finds the library and writes ORT_DYLIB_PATH to $ETC/reflex.env"
    fi
fi

# 5. The unit, enabled at boot; a running service moves to the new release.
install -d -m 755 "$UNITS" "$UNITS/multi-user.target.wants"
if ! cmp -s "$BASE/$REL/systemd/reflex.service" "$UNITS/reflex.service"; then
    install -m 644 "$BASE/$REL/systemd/reflex.service" "$UNITS/reflex.service"
    say "installed $UNITS/reflex.service"
    CHANGED=1
fi
if have_systemd; then
    systemctl daemon-reload
    systemctl enable --quiet reflex.service
    if [ "$CHANGED" = 1 ]; then restart_if_running; fi
else
    ln -sfn /etc/systemd/system/reflex.service "$UNITS/multi-user.target.wants/reflex.service"
fi

if live && [ "$(uname -m)" = "${TARGET%%-*}" ]; then
    "$BASE/current/bin/reflex" --version > /dev/null || die "$BASE/current/bin/reflex does not run on this machine"
fi
say "done. Next: set the arm's port and calibration in $ETC/robot.toml, put ca.pem, robot.pem and"
say "robot.key in $ETC/keys (reflex keys init, on a workstation), then check and start:"
say "  $BASE/current/bin/reflex doctor --config $ETC/robot.toml"
say "  systemctl start reflex; journalctl -u reflex -f"
