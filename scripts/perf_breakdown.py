#!/usr/bin/env python3
"""Attributes each sample of a `perf record -g` of the service to one part of a limit check:
the first rule (in this order) that matches any frame of its call stack. Prints the share of
samples and, given the CPU per request, the µs per request of each part.

    scripts/perf_breakdown.py perf.data [cpu_us_per_request]
"""
import collections
import re
import subprocess
import sys

RULES = [
    ('tracing (span, events, formatting)', r'tracing_subscriber|tracing_core|tracing::span|nu_ansi_term|drop_in_place<tracing'),
    ('metrics', r'metrics_util|metrics_exporter|metrics::key|metrics::recorder|palisade::telemetry'),
    ('auth token check', r'palisade::api::extract::authorize|palisade::access::'),
    ('JSON decode of the body', r'JsonBody as axum_core|Json<T>::from_bytes|serde_path_to_error|ApiJson|Deserialize for palisade::api::limit'),
    ('classification and canonical target', r'Budgets::classify|limiter::target'),
    ('multiplier defaults (scoring pull signals)', r'DefaultMultipliers>::defaults|default_for|explain::.*pull|ReputationSignal'),
    ('scoring observe (baselines, offenders)', r'observe_check|Baselines::observe|offenders'),
    ('L1 cache', r'limiter::l1'),
    ('scopes and keys', r'Limiter::scopes|SubjectKey|store::keys'),
    ('Redis client (encode, coalescer, reply)', r'redis_backend|redis::'),
    ('in-process buckets (the embedded store)', r'memory_backend|store::memory|Limiter::evaluate'),
    ('decision (conclude, outcomes)', r'Limiter::conclude|Limiter::outcome'),
    ('response JSON and headers', r'api::limit::respond|api::layer::headers|IntoResponse>::into_response|LimitAllowed|HeaderMap|IntoResponseParts'),
    ('request context middleware', r'palisade::api::context|palisade::api::request_id'),
    ('HTTP parse and encode (hyper)', r'Http1Transaction>::parse|Http1Transaction>::encode|poll_read_from_io|h1::io::Buffered<T,B>::parse'),
    ('kernel: write (response, loopback delivery)', r'writev|sys_write|tcp_sendmsg'),
    ('kernel: read', r'__libc_recv|sys_recvfrom|tcp_recvmsg|ksys_read'),
    ('scheduler, epoll, wake-ups', r'epoll_wait|__schedule|schedule_hrtimeout|futex|finish_task_switch|try_to_wake_up|park_internal|park_condvar|unpark|wake_by|asm_sysvec|irqentry_exit'),
    ('allocator', r' _?mi_|mi_free|malloc|rust_dealloc|rust_alloc'),
    ('axum and tower (routing, moving futures)', r'axum::|tower::'),
    ('hyper, other', r'hyper'),
    ('tokio, other', r'tokio'),
]


def main():
    data = sys.argv[1]
    us = float(sys.argv[2]) if len(sys.argv) > 2 else None
    script = subprocess.run(['perf', 'script', '-i', data], capture_output=True, text=True, check=True).stdout
    rules = [(name, re.compile(pattern)) for name, pattern in RULES]
    count = collections.Counter()
    for sample in script.split('\n\n'):
        frames = [line.strip() for line in sample.split('\n')[1:] if line.strip()]
        if not frames:
            continue
        part = next((name for name, rx in rules if any(rx.search(f) for f in frames)), 'other')
        count[part] += 1
    total = sum(count.values())
    print('| part | share | µs per request |\n|---|---|---|')
    for name in [n for n, _ in RULES] + ['other']:
        share = count[name] / total
        cost = f'{us * share:.1f}' if us else ''
        print(f'| {name} | {100 * share:.1f} % | {cost} |')
    print(f'\n{total} samples')


if __name__ == '__main__':
    main()
