//! Metric names, their descriptions and the process-wide Prometheus recorder.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// HTTP requests served, by `route` (matched path), `method` and `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "palisade_http_requests_total";
/// HTTP request latency in seconds, by `route` and `method`.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "palisade_http_request_duration_seconds";
/// Store readiness checks that failed, by `store` (`durable` or `hot`).
pub const STORE_UNAVAILABLE_TOTAL: &str = "palisade_store_unavailable_total";
/// API-token authentications, by `outcome` (`ok`, `unknown`, `forbidden`).
pub const ACCESS_CHECKS_TOTAL: &str = "palisade_access_checks_total";

/// Limit decisions, by endpoint `class`, deciding `scope` and `outcome` (`allowed`,
/// `limited`, `shadow_limited`, `fail_open`, `fail_closed`).
pub const LIMIT_DECISIONS_TOTAL: &str = "palisade_limit_decisions_total";
/// Remaining tokens ÷ limit of the deciding scope, by `class` (p99 near 0: limits too tight).
pub const LIMIT_REMAINING_RATIO: &str = "palisade_limit_remaining_ratio";
/// Redis round-trip latency in seconds, by `op`.
pub const REDIS_LATENCY_SECONDS: &str = "palisade_redis_latency_seconds";
/// Decisions made without the hot store, by `class` and `outcome` (`fail_open`, `fail_closed`).
pub const FAIL_OPEN_TOTAL: &str = "palisade_fail_open_total";
/// Limit checks answered from the L1 cache of blocked buckets.
pub const LIMIT_L1_HITS_TOTAL: &str = "palisade_limit_l1_hits_total";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The Prometheus recorder of this process, installed on first use.
///
/// One recorder per process: several `App`s in one test binary share it.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    1.0,
                ])
                .expect("static bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (a library user's); then ours only
            // renders what it sees, which is still a valid, empty exposition.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!(HTTP_REQUESTS_TOTAL, "HTTP requests served");
    metrics::describe_histogram!(
        HTTP_REQUEST_DURATION_SECONDS,
        metrics::Unit::Seconds,
        "HTTP request latency"
    );
    metrics::describe_counter!(
        STORE_UNAVAILABLE_TOTAL,
        "Readiness checks that found a store unreachable"
    );
    metrics::describe_counter!(ACCESS_CHECKS_TOTAL, "API-token authentications by outcome");
    metrics::describe_counter!(
        LIMIT_DECISIONS_TOTAL,
        "Limit decisions by class, deciding scope and outcome"
    );
    metrics::describe_histogram!(
        LIMIT_REMAINING_RATIO,
        "Remaining tokens divided by the limit of the deciding scope"
    );
    metrics::describe_histogram!(
        REDIS_LATENCY_SECONDS,
        metrics::Unit::Seconds,
        "Redis round-trip latency"
    );
    metrics::describe_counter!(
        FAIL_OPEN_TOTAL,
        "Limit decisions made without the hot store"
    );
    metrics::describe_counter!(
        LIMIT_L1_HITS_TOTAL,
        "Limit checks answered from the L1 cache"
    );
}
