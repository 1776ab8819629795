#!/bin/sh
# Install the Debian packages anytune needs, only those that are missing.
# Usage: scripts/setup.sh [--test] [--dev] [--aarch64]
#   (none)     what building and running need (make run)
#   --test     also what the test suite needs (make test): clang's sanitizers,
#              chromium, node and npm, the tests' npm packages, and the ARM
#              cross build's (--aarch64)
#   --dev      also what regenerating the goldens and the benchmarks' PyTorch side need
#   --aarch64  the cross compiler, qemu and the arm64 libraries of the ARM
#              build (scripts/test_aarch64.sh); adds the arm64 architecture to dpkg
set -e
test_deps=0
dev_deps=0
arm_deps=0
for a in "$@"; do
  case "$a" in
    --test) test_deps=1; arm_deps=1 ;;
    --dev) dev_deps=1 ;;
    --aarch64) arm_deps=1 ;;
    *) echo "setup: unknown option $a (use --test, --dev, --aarch64)" >&2; exit 2 ;;
  esac
done
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
PKGS="build-essential cmake clang libclang-rt-dev libomp-dev pkg-config \
libcjson-dev libyaml-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev \
libcurl4-openssl-dev libsnappy-dev libzstd-dev zlib1g-dev \
libjpeg62-turbo-dev libpng-dev libwebp-dev \
libopenblas-dev libopenblas0-openmp libdnnl-dev openmpi-bin"
if [ $test_deps = 1 ]; then
  # protoc and python3-protobuf: tests/cli_tensorboard.sh reads the event files with TensorBoard's own protos
  PKGS="$PKGS chromium protobuf-compiler python3-protobuf"
  # python3-numpy: the vision-language tests write their tiny model folder with tools/make_tiny_vlm.py;
  # python3-pil: test_vlm_llamacpp draws its pictures with it
  PKGS="$PKGS python3-numpy python3-pil"
  # node and npm (the web UI's browser test, the GGUF and tokenizer readers):
  # Debian's, unless some node is already on PATH (e.g. one installed from
  # another source, which may bundle npm and conflict with Debian's npm package)
  if ! command -v node >/dev/null 2>&1; then PKGS="$PKGS nodejs"; fi
  if ! command -v npm >/dev/null 2>&1; then PKGS="$PKGS npm"; fi
fi
if [ $arm_deps = 1 ]; then
  # the libraries the build links, for arm64 (multiarch: beside the host's)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then $SUDO dpkg --add-architecture arm64; fi
  PKGS="$PKGS gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user-static libgomp1:arm64 \
libcjson-dev:arm64 libyaml-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libmicrohttpd-dev:arm64 \
libcurl4-openssl-dev:arm64 libsnappy-dev:arm64 libzstd-dev:arm64 zlib1g-dev:arm64 libopenblas-dev:arm64 \
libjpeg62-turbo-dev:arm64 libpng-dev:arm64 libwebp-dev:arm64"
fi
if [ $dev_deps = 1 ]; then
  PKGS="$PKGS python3-torch python3-jinja2 python3-numpy python3-pil libtcmalloc-minimal4 libjemalloc2"
fi
missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  echo "setup: installing:$missing"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends $missing
fi
# The tests' JavaScript checkers (tests/js: the GGUF reader, transformers.js,
# playwright-core), from the lock file, when missing or older than it. Here
# and not in the tests: two tests running npm ci at once would collide.
[ $test_deps = 1 ] || exit 0
cd "$(dirname "$0")/.."
if [ ! -f tests/js/node_modules/.package-lock.json ] ||
   [ tests/js/package-lock.json -nt tests/js/node_modules/.package-lock.json ]; then
  echo "setup: npm ci --prefix tests/js"
  # a registry hiccup should not fail the whole setup: three tries
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error ||
    { sleep 10; npm ci --prefix tests/js --no-audit --no-fund --loglevel=error; } ||
    { sleep 30; npm ci --prefix tests/js --no-audit --no-fund --loglevel=error; }
fi
