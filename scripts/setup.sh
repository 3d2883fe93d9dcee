#!/usr/bin/env bash
# Set up everything pflrepro needs, idempotently: the Fashion-MNIST Debian package (where
# apt is usable; otherwise torchvision downloads it on first use), in CI (CI=true) Debian's
# Chromium and chromedriver for the browser check, a virtual environment from pyproject.toml
# with the pinned torch, and DVC with analytics off.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

# Debian packages: apt-get as root, or through passwordless sudo; the package lists refreshed once, before the
# first install (stale lists name versions the mirror no longer has: Chromium's security updates replace it).
# apt_install returns 1 where apt is not usable or the install fails.
apt_updated=
apt_install() {
  local sudo=
  if ! command -v apt-get >/dev/null 2>&1; then return 1; fi
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else return 1; fi
  fi
  if [ -z "$apt_updated" ]; then $sudo apt-get update -qq >/dev/null 2>&1 || true; apt_updated=1; fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. Fashion-MNIST, offline, from Debian (IDX .gz under /usr/share/datasets/fashion-mnist/)
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  echo "[setup] installing Debian package dataset-fashion-mnist"
  apt_install dataset-fashion-mnist \
    || echo "[setup] apt could not install dataset-fashion-mnist; Fashion-MNIST will be downloaded by torchvision"
fi

# 1b. CI only: Debian's Chromium and its driver, for the JupyterLab browser check (scripts/browser_check.py, run by
# tests/test_browser_check.py, which fails in CI without them and skips elsewhere). 26 packages, about 120 MB downloaded,
# 380 MB installed: 16 s here (2026-11-28, docs/performance.md). A developer installs them when they want the check
# (README.md, "Checking a notebook in a browser"); setup does not put a browser on their machine.
if [ "${CI:-}" = true ] && ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
  echo "[setup] installing Debian packages chromium chromium-driver (CI: the browser check)"
  apt_install chromium chromium-driver \
    || echo "[setup] apt could not install chromium chromium-driver; tests/test_browser_check.py will fail"
fi

# 2. virtual environment (rebuilt only when pyproject.toml changes)
stamp="$VENV/.pflrepro-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] building $VENV (torch 2.14.1, torchvision 0.29.1, the package and its tools)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  # uv installs what pip would, from the same registry, in a third of the time: a fresh clone's setup on our 2-core
  # machine (2026-11-27) took 23 minutes with pip (9 for torch's 3.2 GB of CUDA wheels, 12 to resolve and install the
  # rest) and 7.5 with uv (2 for the venv and uv itself, 4 for torch, 1 for the rest), out of CI's 90. Where uv
  # cannot be had, pip does the same installs.
  # TORCH_INDEX=https://download.pytorch.org/whl/cpu: the CPU-only build, for machines without a GPU (PyPI's
  # wheel carries 3.2 GB of CUDA libraries: a 6.2 GB .venv). That index is not reachable from our CI machines.
  # .pyc files: these machines set PYTHONDONTWRITEBYTECODE=1, so a module without one is compiled again in every
  # process that imports it, and the suite starts dozens (xdist workers, jobs workers, CLI and kernel subprocesses).
  # Measured on a slow CI-like machine (2026-11-27): `import torch` took 45 s of CPU without .pyc files and 21 s with
  # them. torch (imported by every process) is byte-compiled at install; the rest (ray, dvc, jupyter: mostly never
  # imported) is not, and the Makefile unexports PYTHONDONTWRITEBYTECODE so that the first import writes each .pyc.
  if "$VENV/bin/python" -m pip install -q uv >/dev/null 2>&1; then
    install() { "$VENV/bin/python" -m uv pip install -q --python "$VENV/bin/python" "$@"; }
    torch_opts=--compile-bytecode rest_opts=        # uv compiles nothing unless asked
  else
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    install() { "$VENV/bin/python" -m pip install -q "$@"; }
    torch_opts= rest_opts=--no-compile               # pip compiles everything unless told not to
  fi
  install $torch_opts torch==2.14.1 torchvision==0.29.1 ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
  install $rest_opts -e '.[dev,cluster,browser]'    # browser: Selenium (1 s, 30 MB), for the browser check
  "$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
  # jsonschema's optional IRI format checker (pulled in by jupyter-events) builds its grammar at import: 2.9 s
  # added to every papermill call (nbformat imports jsonschema), about 2 minutes of a default repro. Nothing here
  # validates IRIs; jsonschema skips that format without it.
  "$VENV/bin/python" -m pip uninstall -q -y rfc3987-syntax >/dev/null 2>&1 || true
  touch "$stamp"
fi

# Selenium, in a venv built before the `browser` extra was installed with the rest (a file test: no Python started)
if ! compgen -G "$VENV/lib/python*/site-packages/selenium/__init__.py" >/dev/null; then
  echo "[setup] installing Selenium into $VENV (the browser check)"
  { "$VENV/bin/python" -m uv pip install -q --python "$VENV/bin/python" -e '.[browser]' 2>/dev/null \
    || "$VENV/bin/python" -m pip install -q -e '.[browser]'; } >/dev/null \
    || echo "[setup] could not install Selenium; the browser check will not run"
fi

# JupyterLab: saving a notebook of notebooks/ drops its outputs (scripts/jupyter_server_config.py says why);
# copied on every setup, so an edit to it reaches an existing .venv
mkdir -p "$VENV/etc/jupyter" && cp scripts/jupyter_server_config.py "$VENV/etc/jupyter/jupyter_server_config.py"

# 3. DVC: analytics off for this repo and this user; make sure Fashion-MNIST loads
"$VENV/bin/dvc" config --global core.analytics false >/dev/null 2>&1 || true
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  "$VENV/bin/python" -m pflrepro data fmnist --download >/dev/null
fi
echo "[setup] ready: $VENV"
