#!/usr/bin/env python3
"""Redis CPU of lua/token_bucket.lua per call and per check, from Redis' own accounting.

Starts its own redis-server on a free loopback port, loads the script, sends CALLS script
calls each carrying PER_CALL 4-scope requests (global, IP, user, device; 100k random
subjects, as the load bench's bodies), and reads `INFO commandstats`: the script's own time,
with what it calls inside (MGET, PSETEX, TIME). The client's speed does not enter the
figure. Alternate two script files to compare them:

    scripts/token-bucket-cost.py                      # lua/token_bucket.lua, 8 and 1 per call
    scripts/token-bucket-cost.py --script other.lua --per-call 8 --calls 3000

How the cost grows with the live keys Redis holds: `--live-keys 10000,1000000,10000000`
first fills Redis with that many live user buckets (written by the script's own layout: one
8-byte TAT, a TTL), reports Redis' memory per key, then checks users among them:

    scripts/token-bucket-cost.py --live-keys 10000,1000000,10000000 --per-call 1
"""
import argparse
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        arg = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.reader = self.sock.makefile("rb")

    def reply(self):
        line = self.reader.readline()
        kind, rest = line[:1], line[1:].strip()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            length = int(rest)
            return None if length < 0 else self.reader.read(length + 2)[:-2]
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        return rest

    def call(self, *args):
        self.sock.sendall(encode(*args))
        return self.reply()


def requests(rng, per_call, users=100000):
    """PER_CALL requests: per scope its bucket key, multiplier key, capacity, refill/s."""
    calls = []
    for _ in range(per_call):
        n = rng.randint(0, 99999)
        u = rng.randint(0, users - 1)
        ip = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
        calls.append([
            ("tb:v1:{global}:b:global", "tb:v1:{global}:m:read", 100000, 100000),
            (f"tb:v1:{{ip:{ip}}}:b:ip-read", f"tb:v1:{{ip:{ip}}}:m:read", 600, 10),
            (f"tb:v1:{{user:u{u}}}:b:user-read", f"tb:v1:{{user:u{u}}}:m:read", 300, 5),
            (f"tb:v1:{{device:d{n}}}:b:device", f"tb:v1:{{device:d{n}}}:m:read", 600, 10),
        ])
    return calls


def command(sha, batch):
    """One EVALSHA as the service sends it (see the script's header for the layout)."""
    keys, args = [], [len(batch)]
    for scopes in batch:
        for bucket, multiplier, _, _ in scopes:
            keys += [bucket, multiplier]
        args += [1, 1, len(scopes)]
        for _, _, capacity, refill in scopes:
            args += [capacity, refill, 1, 1]
    return encode("EVALSHA", sha, len(keys), *keys, *args)


# Live user buckets, as the script writes them: full in an hour, kept until then.
FILL = """
local t = redis.call('TIME')
local tat = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 3600000000
local value = struct.pack('d', tat)
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  redis.call('PSETEX', 'tb:v1:{user:u' .. i .. '}:b:user-read', 3600000, value)
end
"""


def used_memory(redis):
    info = redis.call("INFO", "memory").decode()
    return int(next(l for l in info.splitlines() if l.startswith("used_memory:")).split(":")[1])


def fill(redis, live):
    """Fills Redis with `live` user buckets; returns what Redis' memory grew by per key."""
    redis.call("FLUSHALL")
    before = used_memory(redis)
    for start in range(0, live, 100000):
        redis.call("EVAL", FILL, 0, start, min(live, start + 100000) - 1)
    return (used_memory(redis) - before) / live


def measure(redis, sha, per_call, calls, seed, users=None):
    """µs of Redis time per call; on a fresh Redis, or among `users` live user buckets."""
    rng = random.Random(seed)
    commands = [command(sha, requests(rng, per_call, users or 100000)) for _ in range(calls)]
    if users is None:
        redis.call("FLUSHALL")
    redis.call("CONFIG", "RESETSTAT")
    for start in range(0, calls, 50):
        chunk = commands[start:start + 50]
        redis.sock.sendall(b"".join(chunk))
        for _ in chunk:
            redis.reply()
    stats = redis.call("INFO", "commandstats").decode()
    line = next(l for l in stats.splitlines() if l.startswith("cmdstat_evalsha:"))
    fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
    return int(fields["usec"]) / int(fields["calls"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", default=os.path.join(ROOT, "lua", "token_bucket.lua"))
    parser.add_argument("--per-call", type=int, action="append")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--live-keys", help="comma-separated counts of live user buckets")
    options = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    work = tempfile.mkdtemp()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", work, "--logfile", os.path.join(work, "redis.log")])
    try:
        for _ in range(100):
            try:
                redis = Redis(port)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise SystemExit("redis-server did not start")
        with open(options.script, encoding="utf-8") as source:
            sha = redis.call("SCRIPT", "LOAD", source.read()).decode()
        if options.live_keys:
            print("| live user buckets | INFO used_memory Δ ÷ keys | Redis µs per request ("
                  + ", ".join(f"{n} per call" for n in options.per_call or [8, 1]) + ") |")
            print("|---|---|---|")
            for live in (int(n) for n in options.live_keys.split(",")):
                per_key = fill(redis, live)
                usecs = [measure(redis, sha, n, options.calls, seed=7, users=live) / n
                         for n in options.per_call or [8, 1]]
                print(f"| {live:,} | {per_key:.1f} B | "
                      + ", ".join(f"{u:.2f}" for u in usecs) + " |")
            return
        for per_call in options.per_call or [8, 1]:
            usec = measure(redis, sha, per_call, options.calls, seed=7)
            print(f"{os.path.basename(options.script)}: {per_call} requests per call: "
                  f"{usec:.1f} µs per call, {usec / per_call:.2f} µs per request")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
