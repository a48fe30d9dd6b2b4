#!/usr/bin/env bash
# qemu's user-mode emulator, for the system test that runs the learner as an AVX2-only processor
# (tests/system/cpus.rs). Installed from Debian's packages when it is missing and this user can.
set -euo pipefail
[ "$(uname -m)" = x86_64 ] || exit 0
command -v qemu-x86_64 > /dev/null && exit 0
install() {
    "$@" apt-get install -y -q qemu-user > /dev/null 2>&1 \
        || { "$@" apt-get update -q > /dev/null && "$@" apt-get install -y -q qemu-user > /dev/null; }
}
if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    echo "installing qemu-user (the learner's other-processor test runs under qemu-x86_64)"
    install
elif command -v sudo > /dev/null && sudo -n true 2> /dev/null && command -v apt-get > /dev/null; then
    echo "installing qemu-user with sudo (the learner's other-processor test runs under qemu-x86_64)"
    install sudo -n
else
    echo "make test needs qemu-x86_64 (Debian/Ubuntu: apt-get install qemu-user; Fedora: dnf install qemu-user)" >&2
    echo "  the test cpus:: runs the learner as an AVX2-only processor under it; install it and run make test again" >&2
    exit 1
fi
command -v qemu-x86_64 > /dev/null || { echo "qemu-user installed, but no qemu-x86_64 on PATH" >&2; exit 1; }
