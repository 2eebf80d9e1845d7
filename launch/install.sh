#!/usr/bin/env bash
# Installs everything orchard_jax needs on a Debian/Ubuntu machine: system packages, Python
# packages, and the command-line tools that run inside sandboxes. Works as root (no sudo needed)
# and as a user with sudo. Safe to run again: what is already there is kept.
#
#   bash launch/install.sh            # everything
#   ORCHARD_INSTALL_SKIP=apt bash launch/install.sh    # skip a step: apt, pip, npm (comma list)
#   PYTHON=.venv/bin/python bash launch/install.sh    # another Python than `python` on PATH
#
# Each step prints one line; a failing step stops the script with its command's error.
set -euo pipefail
cd "$(dirname "$0")/.."

skip=",${ORCHARD_INSTALL_SKIP:-},"
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else echo "install.sh: '$*' needs root: run as root or install sudo" >&2; exit 1
  fi
}

# System packages (Debian names). bubblewrap: the local sandbox backend; slirp4netns: its
# network=True sandboxes (own namespace, no host loopback); libseccomp2: their seccomp
# filter; redis-server: the
# multi-replica env store; git, patch: inside SWE task sandboxes; mmdebstrap: the Debian root
# filesystem of SWE task images; skopeo: pushes them to a registry (docker-registry: a local
# one for the tests); chromium-headless-shell: the browser of GUI rollouts (Playwright launches
# it through executable_path; `playwright install` is never run), with fonts-dejavu-core so
# pages render text.
apt_packages=(bubblewrap slirp4netns libseccomp2 redis-server git patch mmdebstrap skopeo
              docker-registry chromium-headless-shell fonts-dejavu-core)
if [[ $skip != *,apt,* ]]; then
  missing=()
  for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install.sh: system packages: ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "install.sh: system packages: all present"
  fi
fi

# Python packages go into the Python that runs orchard_jax: `python` on PATH (an activated
# virtual environment, pyenv or conda), or $PYTHON. Debian's own python3 refuses pip installs
# (PEP 668), so it is refused here with what to do instead (unless pip is told to break
# system packages: PIP_BREAK_SYSTEM_PACKAGES or break-system-packages in pip's config).
python=${PYTHON:-python}
if [[ $skip != *,pip,* || $skip != *,npm,* ]]; then
  venv_hint="create and activate a virtual environment first (python3 -m venv .venv && . .venv/bin/activate; on Debian: apt-get install python3-venv), or set PYTHON=/path/to/python"
  if ! command -v "$python" >/dev/null; then
    echo "install.sh: no '$python' on PATH: orchard_jax needs Python >= 3.11; $venv_hint" >&2
    exit 1
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "install.sh: $python is Python $("$python" -c 'import platform; print(platform.python_version())'); orchard_jax needs >= 3.11; $venv_hint" >&2
    exit 1
  fi
  pip_config=$("$python" -m pip config list 2>/dev/null || true)
  if [ -z "${PIP_BREAK_SYSTEM_PACKAGES:-}" ] && [[ $pip_config != *break-system-packages* ]] \
     && "$python" -c 'import os, sys, sysconfig
sys.exit(not (sys.prefix == sys.base_prefix and os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
    echo "install.sh: $python ($(command -v "$python")) is the system's Python, which refuses pip installs (PEP 668); $venv_hint" >&2
    exit 1
  fi
fi

if [[ $skip != *,pip,* ]]; then
  echo "install.sh: Python packages (requirements.txt) into $("$python" -c 'import sys; print(sys.prefix)')"
  "$python" -m pip install -q -r requirements.txt
fi

# The external harness CLIs that run inside task sandboxes (agent.harness=codex|claude_code):
# Codex CLI, Claude Code and Node.js 22 from npm at pinned versions, into the cache folder
# sandboxes read (orchard_jax/harness/install.py). npm itself comes from Debian when missing.
if [[ $skip != *,npm,* ]]; then
  if ! command -v npm >/dev/null; then
    echo "install.sh: system packages: npm"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends npm
  fi
  echo "install.sh: harness CLIs (Codex CLI, Claude Code, Node.js 22)"
  "$python" -m orchard_jax.harness install codex claude_code
fi

echo "install.sh: done"
