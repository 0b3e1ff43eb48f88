#!/usr/bin/env bash
# Installs every Debian package Orpheus needs to build, test and run its demo.
# Non-interactive and idempotent: packages already present are skipped. Works as
# root or through sudo.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libeigen3-dev
  libhdf5-dev hdf5-tools
  catch2
  libcli11-dev
  libspdlog-dev libfmt-dev
  libibverbs-dev
  libopenblas-dev
  zlib1g-dev
  dataset-fashion-mnist
  iproute2                                # scripts/netcluster.sh (namespaces, veths, tc)
  python3-h5py python3-numpy              # tests that read saved models as a user would
  python3-torch libopenblas0-pthread      # the peers' check (scripts/bench/peers_check.py)
  bible-kjv-text bible-kjv                # the KJV corpora of scripts/data (text sets, LSTM)
)
# The plots (python3-matplotlib) are installed by scripts/bench/run.sh when needed.

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup: need root or sudo to install: ${missing[*]}" >&2
    exit 2
  fi
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
