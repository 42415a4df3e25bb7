#!/usr/bin/env bash
# Where the CPU of a limit check goes: the release binary built with frame pointers, its own
# redis-server on a free port, wrk driving POST /v1/limit/check (4 scopes, 100k random keys,
# c=50), `perf record -g` on the service only, then scripts/perf_breakdown.py attributing each
# sample to one part of a decision. Needs perf (Debian: linux-perf), wrk and redis-server.
# Everything started here is stopped by PID at the end.
#   scripts/profile-limit-check.sh            # SECONDS=10 CONCURRENCY=50 WORKERS=2
#   STORE=embedded scripts/profile-limit-check.sh   # in-process buckets, no Redis
set -euo pipefail
cd "$(dirname "$0")/.."
store=${STORE:-redis}
for tool in perf wrk $([ "$store" = redis ] && echo redis-server); do
  command -v $tool >/dev/null || { echo "$tool is not installed" >&2; exit 2; }
done
seconds=${SECONDS_RUN:-10}
concurrency=${CONCURRENCY:-50}
target=${PROFILE_TARGET_DIR:-target/profile}
CARGO_TARGET_DIR=$target RUSTFLAGS="-C force-frame-pointers=yes" cargo build --release --quiet
work=$(mktemp -d)
redis_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token=profile-limiter-token-0123456789
redis=
redis_url=
if [ "$store" = redis ]; then
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --logfile "$work/redis.log" &
  redis=$!
  redis_url="redis://127.0.0.1:$redis_port"
fi
env ${redis_url:+"PALISADE_REDIS_URL=$redis_url"} \
  PALISADE_LISTEN=127.0.0.1:$port PALISADE_GRPC_LISTEN= PALISADE_BOOTSTRAP_TOKEN=$token \
  PALISADE_DATABASE_URL="sqlite://$work/palisade.db" PALISADE_DATA_DIR="$work/data" \
  TOKIO_WORKER_THREADS=${WORKERS:-2} \
  "$target/release/palisade" serve >"$work/server.log" 2>&1 &
server=$!
trap 'kill $server $redis 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 50); do curl -sf "127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.2; done
cat >"$work/check.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
request = function()
  local n = math.random(0, 99999)
  local body = string.format('{"endpoint":"/v1/feed","ip":"10.%d.%d.%d","user_id":"u%d","device_id":"d%d"}',
    math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256, n, n)
  return wrk.format(nil, nil, nil, body)
end
LUA
url="http://127.0.0.1:$port/v1/limit/check"
wrk -t2 -c"$concurrency" -d3s -s "$work/check.lua" "$url" >/dev/null   # warm up
ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
before=$(ticks)
wrk -t2 -c"$concurrency" -d"${seconds}s" -s "$work/check.lua" "$url" >"$work/wrk.txt" &
wrk_pid=$!
sleep 1
perf record -F 999 -g -p "$server" -o "$work/perf.data" -- sleep $((seconds - 2)) 2>/dev/null
wait $wrk_pid
after=$(ticks)
requests=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
cpu_us=$(python3 -c "print(($after - $before) / $(getconf CLK_TCK) * 1e6 / $requests)")
grep -E "Requests/sec|Non-2xx" "$work/wrk.txt" || true
printf 'service CPU per request: %.1f µs\n\n' "$cpu_us"
python3 scripts/perf_breakdown.py "$work/perf.data" "$cpu_us"
