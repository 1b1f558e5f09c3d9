#!/bin/sh
# Test set-up: the report's browser test (tests/report/test_report.py) renders report.html in
# headless Chromium. Installs Debian's `chromium` package when /usr/bin/chromium is absent; does
# nothing otherwise (nor when NORMLAB_CHROMIUM names another Chromium binary, which the test then
# uses). Quiet and idempotent; runs as root (CI) or through sudo when available. No recommended
# packages: headless Chromium needs none of them (udev, upower, printer tools...), and the fonts it
# renders with (DejaVu) come with its dependencies.
set -eu

CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ] || { [ -n "${NORMLAB_CHROMIUM:-}" ] && [ -x "$NORMLAB_CHROMIUM" ]; }; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium.sh: apt-get not found; install Chromium so that $CHROMIUM exists" >&2
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "install_chromium.sh: run as root (or install sudo) to apt-get install chromium" >&2
    exit 1
fi
echo "install_chromium.sh: installing chromium with apt-get (once)" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium >/dev/null
if [ ! -x "$CHROMIUM" ]; then
    echo "install_chromium.sh: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
