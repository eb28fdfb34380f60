#!/usr/bin/env bash
# Smoke test of docker/compose.yaml: build the image, bring up the CPU part of the production stack
# (PostgreSQL, Redis, migrate, web, worker, beat, Ray head; not the GPU workers), launch a run through
# the REST API as a user would, wait until its metrics are stored, then bring everything down again
# (volumes included). Prints how long each stage took.
#
#   bash scripts/compose_smoke.sh            # needs Docker with the compose v2 plugin, and registry access
#
# It uses docker/.env when it exists; otherwise it writes one from docker/env.example with fresh random
# secrets and removes it at the end. The web server is reached on localhost:8000 the way the TLS proxy
# in front of it would forward a request (X-Forwarded-Proto: https, see docker/env.example).
set -euo pipefail
cd "$(dirname "$0")/.."

export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-rlp-smoke}"
compose=(docker compose -f docker/compose.yaml)
base=http://localhost:8000
t0=$(date +%s)
stage() { echo "[$(($(date +%s) - t0)) s] $*"; }

created_env=0
if [ ! -f docker/.env ]; then
  secret=$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')
  password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  sed -e "s|^DJANGO_SECRET_KEY=.*|DJANGO_SECRET_KEY=$secret|" -e "s|^POSTGRES_PASSWORD=.*|POSTGRES_PASSWORD=$password|" \
    docker/env.example > docker/.env
  created_env=1
fi
cleanup() {
  stage "down"
  "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  if [ "$created_env" = 1 ]; then rm -f docker/.env; fi
}
trap cleanup EXIT

stage "building the image"
"${compose[@]}" build web
stage "starting postgres, redis, migrate, web, worker, beat, ray-head (waiting for their health checks)"
"${compose[@]}" up -d --wait postgres redis web worker beat ray-head

stage "creating a user, a project and an API token"
read -r token project < <("${compose[@]}" exec -T web python manage.py shell -c '
from django.contrib.auth import get_user_model
from accounts.services import project_create, token_create
user = get_user_model().objects.create_user("smoke", password=None)
print(token_create(user=user, name="smoke").secret, project_create(name="smoke", user=user).pk)
' | tail -n 1)

api() {  # METHOD PATH [JSON]: a client behind the TLS proxy, with the token
  curl -fsS -X "$1" -H "Authorization: Token $token" -H "Content-Type: application/json" \
    -H "X-Forwarded-Proto: https" "$base$2" ${3:+-d "$3"}
}
json() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

stage "launching a demo-cpu run (20 steps) through the REST API"
config=$(api GET /api/presets/demo-cpu | python3 -c '
import json, sys
cfg = json.load(sys.stdin)
cfg["trainer"]["total_steps"] = 20
print(json.dumps(cfg))')
experiment=$(api POST /api/experiments "{\"project\": $project, \"name\": \"smoke\", \"config\": $config}" | json '["id"]')
run=$(api POST /api/runs "{\"experiment\": $experiment}" | json '["id"]')

stage "waiting for run $run to report metrics"
for _ in $(seq 300); do
  keys=$(api GET "/api/runs/$run/metrics/keys" | json '["keys"]')
  state=$(api GET "/api/runs/$run" | json '["state"]')
  if [ "$keys" != "[]" ]; then break; fi
  if [ "$state" = failed ]; then api GET "/api/runs/$run" | json '["error"]' >&2; exit 1; fi
  sleep 2
done
[ "$keys" != "[]" ] || { echo "error: no metrics from run $run within 10 minutes (state: $state)" >&2; exit 1; }
stage "run $run is $state and reports $(echo "$keys" | python3 -c 'import ast, sys; print(len(ast.literal_eval(sys.stdin.read())))') metric keys: the stack ingests"
