#!/usr/bin/env bash
# Builds, from Debian's packages only, the base images docker/compose.yaml needs when no image registry
# is reachable (air-gapped machines):
#
#   rlp-local/debian:bookworm      debootstrap --variant=minbase bookworm, imported (docker import)
#   rlp-local/python:3.11          stands in for python:3.11-slim-bookworm  (docker/local/python.Dockerfile)
#   rlp-local/postgres:15          stands in for postgres:16                 (docker/local/postgres.Dockerfile)
#   rlp-local/redis:7              stands in for redis:7                     (docker/local/redis.Dockerfile)
#   rlp-local/wheels:latest        WHEELS_DIR's wheels, when given (docker/local/wheels.Dockerfile)
#
# and writes docker/local.env, the settings that point the build and compose at them
# (scripts/compose_smoke.sh reads it). Images that exist already are kept (--force rebuilds them).
#
#   sudo bash scripts/local_base_images.sh [--force]
#
# Environment: DEBIAN_MIRROR (default: the first Debian mirror in apt's sources, else deb.debian.org),
# WHEELS_DIR (wheels pip should find locally, e.g. torch's CPU build; default /opt/wheels if it holds
# any). Needs root (debootstrap), debootstrap and a Docker daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
[ "${1:-}" = --force ] && force=1
docker=${DOCKER:-docker}
t0=$(date +%s)
stage() { echo "[local_base_images $(($(date +%s) - t0)) s] $*"; }
have() { [ "$force" = 0 ] && $docker image inspect "$1" >/dev/null 2>&1; }

mirror=${DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hsoE '(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* \
    | awk '{print $2}' | head -n 1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi

if have rlp-local/debian:bookworm; then
  stage "rlp-local/debian:bookworm exists"
else
  command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "error: debootstrap needs root" >&2; exit 1; }
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  stage "debootstrap bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  # The image's apt uses the same mirror; no apt caches or lists in the image.
  echo "deb $mirror bookworm main" > "$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | $docker import -c 'CMD ["bash"]' -c 'ENV LANG=C.UTF-8' - rlp-local/debian:bookworm >/dev/null
  rm -rf "$root"
  trap - EXIT
  stage "imported rlp-local/debian:bookworm"
fi

build() {  # IMAGE DOCKERFILE [CONTEXT]
  if have "$1"; then stage "$1 exists"; return; fi
  stage "building $1"
  $docker build -q -t "$1" -f "$2" "${3:-docker/local}" >/dev/null
}
build rlp-local/python:3.11 docker/local/python.Dockerfile
build rlp-local/postgres:15 docker/local/postgres.Dockerfile
build rlp-local/redis:7 docker/local/redis.Dockerfile

wheels_dir=${WHEELS_DIR:-}
if [ -z "$wheels_dir" ] && compgen -G "/opt/wheels/*.whl" >/dev/null; then wheels_dir=/opt/wheels; fi
wheels_image=scratch
if [ -n "$wheels_dir" ]; then
  build rlp-local/wheels:latest "$PWD/docker/local/wheels.Dockerfile" "$wheels_dir"
  wheels_image=rlp-local/wheels:latest
fi

cat > docker/local.env <<ENV
# Written by scripts/local_base_images.sh: the images built from Debian's packages on this machine.
PYTHON_IMAGE=rlp-local/python:3.11
POSTGRES_IMAGE=rlp-local/postgres:15
REDIS_IMAGE=rlp-local/redis:7
WHEELS_IMAGE=$wheels_image
TORCH_INDEX_URL=$([ "$wheels_image" = scratch ] && echo https://download.pytorch.org/whl/cpu)
ENV
stage "done; docker/local.env names them"
