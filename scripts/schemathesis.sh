#!/usr/bin/env bash
# Schemathesis (PyPI) against a local Palisade: every operation of /openapi.json with an admin
# token, all checks (no 5xx, responses conform to the schema, negative data rejected, …).
# Embedded backend in a temporary folder; the server is stopped by PID at the end.
#   pip install schemathesis && scripts/schemathesis.sh [extra st options]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v st >/dev/null || { echo "schemathesis is not installed: pip install schemathesis" >&2; exit 2; }
cargo build --quiet
work=$(mktemp -d)
port=${PORT:-18080}
token=schemathesis-admin-token-0123
PALISADE_LISTEN=127.0.0.1:$port PALISADE_GRPC_LISTEN= PALISADE_BOOTSTRAP_TOKEN=$token \
  PALISADE_DATABASE_URL="sqlite://$work/palisade.db" PALISADE_DATA_DIR="$work/data" \
  target/debug/palisade serve >"$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 50); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
st run "http://127.0.0.1:$port/openapi.json" -H "Authorization: Bearer $token" \
  --checks all --max-examples "${EXAMPLES:-25}" --workers 2 "$@"
