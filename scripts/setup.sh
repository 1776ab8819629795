#!/bin/sh
# Install the Debian packages anytune needs, only those that are missing.
# Usage: scripts/setup.sh [--dev]   (--dev adds what the goldens/benchmarks need)
set -e
PKGS="build-essential cmake clang libclang-rt-dev libomp-dev pkg-config \
libcjson-dev libyaml-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev \
libopenblas-dev libdnnl-dev openmpi-bin chromium"
# node and npm (the web UI's browser test, the GGUF reader check): Debian's,
# unless some node is already on PATH (e.g. NodeSource's, which bundles npm
# and conflicts with Debian's npm package)
if ! command -v node >/dev/null 2>&1; then PKGS="$PKGS nodejs"; fi
if ! command -v npm >/dev/null 2>&1; then PKGS="$PKGS npm"; fi
if [ "$1" = "--dev" ]; then
  PKGS="$PKGS python3-torch python3-jinja2 python3-numpy libopenblas0-openmp"
fi
missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  echo "setup: installing:$missing"
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends $missing
fi
# The tests' JavaScript checkers (tests/js: the GGUF reader, transformers.js,
# playwright-core), from the lock file, when missing or older than it. Here
# and not in the tests: two tests running npm ci at once would collide.
cd "$(dirname "$0")/.."
if [ ! -f tests/js/node_modules/.package-lock.json ] ||
   [ tests/js/package-lock.json -nt tests/js/node_modules/.package-lock.json ]; then
  echo "setup: npm ci --prefix tests/js"
  # a registry hiccup should not fail the whole setup: three tries
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error ||
    { sleep 10; npm ci --prefix tests/js --no-audit --no-fund --loglevel=error; } ||
    { sleep 30; npm ci --prefix tests/js --no-audit --no-fund --loglevel=error; }
fi
