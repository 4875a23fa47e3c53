#!/usr/bin/env bash
# Sets up everything tfsift needs on a fresh Debian machine with Python 3.11:
# apt packages (OpenMPI, the two headers TF 2.21 forgets), a virtualenv with the
# pinned stack, and Horovod 0.28.1 built from its sdist against TF 2.21 (cached).
# Idempotent: a second run only checks. See docs/install.md for the why.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${TFSIFT_PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
VENV="${TFSIFT_VENV:-$ROOT/.venv}"
CACHE="${TFSIFT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfsift}"
HOROVOD_VERSION=0.28.1
TF_VERSION=2.21.0
# iproute2: the simulated hosts of the multi-host tests (scripts/simhosts.sh)
APT_PACKAGES=(openmpi-bin libopenmpi-dev libhighwayhash-dev libfarmhash-dev cmake g++ make iproute2)

log() { printf '[setup] %s\n' "$*" >&2; }

need_apt() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  "$PYTHON" - <<'PY' || missing+=("python3-dev" "python3-venv")
import os, sysconfig, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY
  if ((${#missing[@]})); then
    log "installing apt packages: ${missing[*]}"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

make_venv() {
  local ver
  ver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  [ "$ver" = "3.11" ] || { log "Python 3.11 is required, found $ver ($PYTHON); set TFSIFT_PYTHON"; exit 1; }
  TEMPLATE="$(template_of)"
  if [ ! -e "$VENV" ] && venv_link "$TEMPLATE" "$VENV"; then
    log "linked the virtualenv from $TEMPLATE"
  fi
  local created=0
  [ -x "$VENV/bin/python" ] || { log "creating virtualenv $VENV"; "$PYTHON" -m venv "$VENV"; created=1; }
  local stamp="$VENV/.tfsift-stack" want
  want="$(cat "$ROOT/requirements.in" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return 0
  MADE_STACK="$created"  # a venv made here holds the stack and nothing else
  pip_q install --upgrade pip
  log "installing the pinned stack (constraints.txt)"
  # pip byte-compiles its 10,000 files on one core; compileall does it on all of them
  # (19 s against 13 s on 2 cores). The .pyc files must exist: with PYTHONDONTWRITEBYTECODE
  # set, every rank would compile TensorFlow again at import.
  pip_q install --no-compile -r "$ROOT/requirements.in" -c "$ROOT/constraints.txt"
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null
  echo "$want" > "$stamp"
}

# A fresh checkout's venv is linked from the one the last fresh install left in the cache
# (TEMPLATE, keyed by the lock, Horovod and the interpreter) instead of installed again:
# 1 s instead of 35 s. See venv_template.sh; Horovod is checked after linking as after
# installing.
# shellcheck source=scripts/venv_template.sh
source "$ROOT/scripts/venv_template.sh"
TEMPLATE=""
MADE_STACK=0

template_of() {
  local key
  key="$({ cat "$ROOT/requirements.in" "$ROOT/constraints.txt"
    echo "horovod $HOROVOD_VERSION tf $TF_VERSION"
    "$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable), sys.version)'
  } | sha256sum | cut -c1-16)"
  echo "$CACHE/venvs/$key"
}

# pip, quiet, without the per-index warnings some machines' pip.conf produces.
pip_q() {
  "$VENV/bin/python" -m pip -q "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

horovod_ok() {
  "$VENV/bin/python" - <<PY 2>/dev/null
import horovod, horovod.tensorflow as hvd
assert horovod.__version__ == "$HOROVOD_VERSION"
assert hvd.mpi_built() and hvd.gloo_built()
PY
}

build_horovod() {
  local key="horovod-${HOROVOD_VERSION}-tf${TF_VERSION}-py311"
  local wheels="$CACHE/wheels/$key"
  if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod $HOROVOD_VERSION against TF $TF_VERSION (a few minutes, cached in $wheels)"
    local work; work="$(mktemp -d)"
    pip_q download --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-*.tar.gz -C "$work"
    local src="$work/horovod-$HOROVOD_VERSION"
    # xla_mpi_ops.cc includes XLA headers that moved in TF 2.21 (horovod#4290, PR #4302).
    sed -i '/xla_mpi_ops.cc/d' "$src/horovod/tensorflow/CMakeLists.txt"
    # TF 2.21 headers include highwayhash/ and farmhash.h without shipping them; expose only those two.
    local shim="$work/include-shim"; mkdir -p "$shim"
    ln -s /usr/include/highwayhash "$shim/highwayhash"
    ln -s /usr/include/farmhash.h "$shim/farmhash.h"
    CPLUS_INCLUDE_PATH="$shim" MAKEFLAGS="-j$(nproc)" \
      HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      pip_q wheel --no-build-isolation --no-deps -w "$work/dist" "$src"
    mkdir -p "$wheels"; cp "$work"/dist/horovod-*.whl "$wheels/"; rm -rf "$work"
  fi
  pip_q install --no-deps --force-reinstall "$wheels"/horovod-*.whl
}

need_apt
make_venv
if ! horovod_ok; then  # imports TensorFlow: 4 s, so once
  build_horovod
  horovod_ok || { log "Horovod is not usable after the build"; exit 1; }
fi
# the venv holds the stack and Horovod only until tfsift's editable install names the checkout
if [ "$MADE_STACK" = 1 ] && venv_keep "$VENV" "$TEMPLATE"; then
  log "kept the virtualenv as $TEMPLATE for the next fresh checkout"
fi
"$VENV/bin/python" -c "import importlib.util as u, sys; s = u.find_spec('tfsift')
sys.exit(s is None or s.origin != '$ROOT/tfsift/__init__.py')" \
  2>/dev/null && [ -x "$VENV/bin/tfsift" ] || pip_q install --no-deps -e "$ROOT" 2>/dev/null
log "ready: $VENV"
