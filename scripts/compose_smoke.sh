#!/usr/bin/env bash
# End-to-end smoke test of docker/compose.yaml, as a user would deploy it: build the platform image,
# bring up the CPU part of the production stack (PostgreSQL, Redis, migrate, web, worker, beat, Ray head;
# not the GPU workers) and wait for every health check, then in a one-off container of the image on the
# stack's network (scripts/compose_smoke_check.py): create a user, log in, launch a demo-cpu run through
# the REST API and follow it over the run websocket; restart the web container mid-run; the run must
# succeed with every point the engine logged stored once and seen by the client. Then everything comes
# down again, volumes included. Prints how long each stage took and a SMOKE summary line.
#
#   bash scripts/compose_smoke.sh              # or: make compose-smoke
#   bash scripts/compose_smoke.sh --preflight  # status 0 when it can run here, else 3 and the reason
#                                              # (SMOKE_NEED_IMAGE=1: also an image built before, i.e. cached layers)
#
# Works with the compose v2 plugin (`docker compose`) or Compose 1.29 (`docker-compose`). Base images:
# SMOKE_BASE=local uses the stand-ins of scripts/local_base_images.sh (docker/local.env, air-gapped
# machines), SMOKE_BASE=official the registry's (python:3.11-slim-bookworm, postgres:16, redis:7);
# the default (auto) takes docker/local.env when it exists. The image is built with BuildKit (buildx,
# or the client built into Docker 20.10-22: set DOCKER to such a client when `docker` is newer and has
# no buildx). pip's CA bundle (PIP_CERT or SMOKE_CA) and a pip configuration (SMOKE_PIP_CONF) are passed
# as build secrets: never written to a layer. SMOKE_STEPS (default 1000, every step logged: ~0.1 s
# each) and SMOKE_RESTART_AFTER (default 20 steps; 0 = no restart) shape the run; SMOKE_UP_TIMEOUT (default 600 s) bounds the wait for
# the health checks; WEB_PORT (default: a free port) publishes the web server.
#
# It uses docker/.env when it exists; otherwise it writes one from docker/env.example with fresh random
# secrets and removes it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-rlp-smoke}"
docker=${DOCKER:-docker}
preflight=0
[ "${1:-}" = --preflight ] && preflight=1
# --preflight: only say whether the smoke can run here (status 0), or print why not (status 3).
cannot() {
  if [ "$preflight" = 1 ]; then echo "$*"; exit 3; fi
  echo "error: $*" >&2
  exit 1
}
command -v "$docker" >/dev/null 2>&1 || cannot "no docker client"
"$docker" info >/dev/null 2>&1 || cannot "no Docker daemon answers ($docker info fails)"
if "$docker" compose version >/dev/null 2>&1; then
  compose=("$docker" compose -f docker/compose.yaml)
elif command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose -f docker/compose.yaml)
else
  cannot "neither 'docker compose' nor 'docker-compose' is installed"
fi
t0=$(date +%s)
ts=$t0
stage() { local now; now=$(date +%s); echo "[smoke $((now - t0)) s] $* "; ts=$now; }
took() { echo $(($(date +%s) - ts)); }
times=()

base=${SMOKE_BASE:-auto}
if [ "$base" = auto ]; then base=$([ -f docker/local.env ] && echo local || echo official); fi
if [ "$base" = local ]; then
  [ -f docker/local.env ] || cannot "docker/local.env is missing: run scripts/local_base_images.sh"
  set -a
  # shellcheck disable=SC1091
  . docker/local.env
  set +a
fi
for image in "${PYTHON_IMAGE:-python:3.11-slim-bookworm}" "${POSTGRES_IMAGE:-postgres:16}" "${REDIS_IMAGE:-redis:7}"; do
  # Official images are pulled by the build and by compose; --preflight asks for them on this machine.
  "$docker" image inspect "$image" >/dev/null 2>&1 || { [ "$base" = official ] && [ "$preflight" = 0 ]; } \
    || cannot "base image $image is not on this machine (docker pull it, or run scripts/local_base_images.sh)"
done
export WEB_PORT="${WEB_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}"

# A BuildKit-capable client: buildx, else a client with BuildKit built in (20.10 to 22).
build=()
for d in "$docker" /usr/bin/docker; do
  if "$d" buildx version >/dev/null 2>&1; then build=("$d" buildx build --load); break; fi
  v=$("$d" version --format '{{.Client.Version}}' 2>/dev/null || true)
  if [ "${v%%.*}" -ge 20 ] 2>/dev/null && [ "${v%%.*}" -lt 23 ]; then build=(env DOCKER_BUILDKIT=1 "$d" build); break; fi
done
[ ${#build[@]} -gt 0 ] || cannot "no BuildKit-capable docker client (install buildx, or set DOCKER)"
if [ "${SMOKE_NEED_IMAGE:-0}" = 1 ]; then  # CI: a cold build of the image does not fit its time budget
  "$docker" image inspect rlplatform:latest >/dev/null 2>&1 \
    || cannot "rlplatform:latest was never built here (a cold build takes ~10 min): run make compose-smoke once"
fi
[ "$preflight" = 0 ] || exit 0

created_env=0
if [ ! -f docker/.env ]; then
  secret=$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')
  password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  sed -e "s|^DJANGO_SECRET_KEY=.*|DJANGO_SECRET_KEY=$secret|" -e "s|^POSTGRES_PASSWORD=.*|POSTGRES_PASSWORD=$password|" \
    docker/env.example > docker/.env
  created_env=1
fi
log=$(mktemp)
cleanup() {
  status=$?
  stage "down (volumes included)"
  "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  if [ "$created_env" = 1 ]; then rm -f docker/.env; fi
  rm -f "$log"
  [ "$status" = 0 ] && echo "SMOKE ok: base=$base ${times[*]} down=$(took)s total=$(($(date +%s) - t0))s"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stage "building rlplatform:latest on $base base images (${build[*]})"
secrets=()
ca=${SMOKE_CA:-${PIP_CERT:-}}
if [ -n "$ca" ] && [ -f "$ca" ]; then secrets+=(--secret "id=ca,src=$ca"); fi
if [ -n "${SMOKE_PIP_CONF:-}" ]; then secrets+=(--secret "id=pip_conf,src=$SMOKE_PIP_CONF"); fi
previous=$("$docker" image inspect -f '{{.Id}}' rlplatform:latest 2>/dev/null || true)
"${build[@]}" -f docker/Dockerfile -t rlplatform:latest "${secrets[@]}" \
  --build-arg "PYTHON_IMAGE=${PYTHON_IMAGE:-python:3.11-slim-bookworm}" \
  --build-arg "WHEELS_IMAGE=${WHEELS_IMAGE:-scratch}" \
  --build-arg "TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}" . >"$log" 2>&1 \
  || { tail -n 30 "$log" >&2; exit 1; }
times+=("build=$(took)s")
# The image this build replaced (now untagged) goes, unless a container still uses it.
if [ -n "$previous" ] && [ "$previous" != "$("$docker" image inspect -f '{{.Id}}' rlplatform:latest)" ]; then
  "$docker" rmi "$previous" >/dev/null 2>&1 || true
fi

services=(postgres redis web worker beat ray-head)
stage "up: ${services[*]} (migrate first), waiting for their health checks"
"${compose[@]}" up -d --no-build "${services[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
health() {  # SERVICE -> healthy | starting | unhealthy | exited | ...
  local id  # the service's own container (`ps -q` of Compose 1.29 also lists `run` containers)
  id=$("$docker" ps -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME" \
    --filter "label=com.docker.compose.service=$1" --filter "label=com.docker.compose.oneoff=False")
  [ -n "$id" ] || { echo missing; return; }
  $docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"
}
wait_healthy() {  # TIMEOUT_S SERVICE...
  local deadline=$(($(date +%s) + $1)) svc
  shift
  for svc in "$@"; do
    until [ "$(health "$svc")" = healthy ]; do
      if [ "$(date +%s)" -gt "$deadline" ]; then
        echo "error: $svc is $(health "$svc") after the wait" >&2
        "${compose[@]}" logs --tail 40 "$svc" >&2
        return 1
      fi
      sleep 1
    done
  done
}
wait_healthy "${SMOKE_UP_TIMEOUT:-600}" "${services[@]}"
times+=("up=$(took)s")

steps=${SMOKE_STEPS:-1000}
restart_after=${SMOKE_RESTART_AFTER:-20}
stage "client: a user, a demo-cpu run of $steps steps through the REST API, followed over the websocket"
"${compose[@]}" run --rm --no-deps -T web python scripts/compose_smoke_check.py --steps "$steps" \
  --restart-after "$restart_after" >"$log" 2>&1 &
client=$!
client_t0=$(date +%s)
restarted=0
while kill -0 "$client" 2>/dev/null; do
  if [ "$restarted" = 0 ] && grep -q RESTART-WEB "$log"; then
    restarted=1
    cat "$log"
    stage "restarting the web container mid-run"
    "${compose[@]}" restart web >/dev/null 2>&1
    wait_healthy 180 web
    times+=("web_restart=$(took)s")
    stage "web is healthy again"
  fi
  sleep 0.5
done
wait "$client" && rc=0 || rc=$?
if [ "$restarted" = 1 ]; then sed -n '/RESTART-WEB/,$p' "$log" | tail -n +2; else cat "$log"; fi
[ "$rc" = 0 ] || { echo "error: the client failed (status $rc)" >&2; exit 1; }
times+=("client=$(($(date +%s) - client_t0))s" "$(sed -n 's/^RESULT //p' "$log")")
stage "run succeeded: points stored = points logged = points seen by the client"
