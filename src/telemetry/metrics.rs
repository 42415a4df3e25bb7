//! Metric names, their descriptions and the process-wide Prometheus recorder.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// HTTP requests served, by `route` (matched path), `method` and `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "palisade_http_requests_total";
/// HTTP request latency in seconds, by `route` and `method`.
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "palisade_http_request_duration_seconds";
/// Store readiness checks that failed, by `store` (`durable` or `hot`).
pub const STORE_UNAVAILABLE_TOTAL: &str = "palisade_store_unavailable_total";
/// 1 while the hot store answers enforcement's commands, 0 after three failures in a row
/// (until the next answer); `/readyz` is 503 while it is 0.
pub const HOT_STORE_HEALTHY: &str = "palisade_hot_store_healthy";
/// Redis Cluster connections rebuilt from the seed nodes because commands kept failing.
pub const HOT_STORE_RECONNECTS_TOTAL: &str = "palisade_hot_store_reconnects_total";
/// Changes made in another region applied to this region's hot store, by `kind`
/// (`lockouts`, `factors`, `list_entries`, `reconcile`).
pub const REGION_CHANGES_TOTAL: &str = "palisade_region_changes_total";
/// Keys of the global budgets this instance holds a leased share of.
pub const REGION_LEASED_KEYS: &str = "palisade_region_leased_keys";
/// API-token authentications, by `outcome` (`ok`, `unknown`, `forbidden`).
pub const ACCESS_CHECKS_TOTAL: &str = "palisade_access_checks_total";
/// Uses of the bootstrap token, by outcome (`accepted`, `refused`: retired or expired).
pub const BOOTSTRAP_USES_TOTAL: &str = "palisade_bootstrap_uses_total";
/// Token checks answered from the cache because the database did not answer the refresh.
pub const ACCESS_STALE_TOTAL: &str = "palisade_access_stale_total";

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
/// Limit checks per Redis script call (concurrent checks are coalesced on a single Redis).
pub const LIMIT_COALESCED_CHECKS: &str = "palisade_limit_coalesced_checks";

/// Factors stored by push signals, by `signal`, `code` and `mode` (`enforced`, `shadow`).
pub const SCORING_FACTORS_TOTAL: &str = "palisade_scoring_factors_total";
/// Multiplier publishes, by `outcome` (`written`, `superseded` by a newer change).
pub const MULTIPLIER_PUBLISHES_TOTAL: &str = "palisade_multiplier_publishes_total";
/// Keys found far above their baseline, by `kind` (`ip`, `user`, `device`).
pub const ANOMALIES_TOTAL: &str = "palisade_anomalies_total";
/// Keys that became repeat offenders, by `kind`.
pub const OFFENDERS_TOTAL: &str = "palisade_repeat_offenders_total";
/// Alerts raised, by `kind`.
pub const ALERTS_TOTAL: &str = "palisade_alerts_total";
/// Webhook deliveries, by `outcome` (`delivered`, `failed`, `gave_up`).
pub const ALERT_DELIVERIES_TOTAL: &str = "palisade_alert_deliveries_total";
/// Request-telemetry events ingested.
pub const TELEMETRY_EVENTS_TOTAL: &str = "palisade_telemetry_events_total";
/// Seconds between an event's timestamp and its ingestion, by `source` (`auth`, `requests`).
pub const INGEST_LAG_SECONDS: &str = "palisade_ingest_lag_seconds";
/// Keys tracked by the anomaly baselines of this instance.
pub const BASELINE_KEYS: &str = "palisade_baseline_keys";
/// Attestation submissions, by `platform` and `outcome` (the level, or the rejection code).
pub const ATTESTATIONS_TOTAL: &str = "palisade_attestations_total";
/// Envoy rate limit service calls, by `outcome` (`ok`, `over_limit`, `error`).
pub const GRPC_REQUESTS_TOTAL: &str = "palisade_grpc_requests_total";
/// Time to answer an Envoy rate limit service call, seconds.
pub const GRPC_REQUEST_SECONDS: &str = "palisade_grpc_request_duration_seconds";
/// Descriptors matched by an envoyproxy/ratelimit rule, by `domain`, `rule` (the rule's
/// metric key, upstream's stats key) and `outcome` (`within_limit`, `over_limit`,
/// `shadow_mode`, `unlimited`).
pub const ENVOY_RULE_HITS_TOTAL: &str = "palisade_envoy_rule_hits_total";
/// Loads of the envoyproxy/ratelimit config files, by `outcome` (`loaded`, `failed`).
pub const ENVOY_CONFIG_LOADS_TOTAL: &str = "palisade_envoy_config_loads_total";
/// Forward-auth answers, by `outcome` (`pass`, `block`).
pub const FORWARD_AUTH_TOTAL: &str = "palisade_forward_auth_total";
/// CrowdSec stream pulls, by `startup` (`true`, `false`).
pub const CROWDSEC_PULLS_TOTAL: &str = "palisade_crowdsec_pulls_total";
/// Rebuilds of the hot store's enforcement state from the durable store, by `outcome`
/// (`done`, `failed`).
pub const HOT_REBUILDS_TOTAL: &str = "palisade_hot_rebuilds_total";
/// 1 while this instance rebuilds the hot store (or waits for another instance's rebuild).
pub const HOT_REBUILDING: &str = "palisade_hot_rebuilding";
/// Seconds the last rebuild of the hot store took.
pub const HOT_REBUILD_SECONDS: &str = "palisade_hot_rebuild_seconds";
/// Scoring factors enforced but not written to the durable store (it failed): they are lost
/// if the hot store loses its data before they are asserted again.
pub const FACTOR_PERSIST_FAILURES_TOTAL: &str = "palisade_factor_persist_failures_total";
/// Signed identities checked, by `outcome` (`valid`, `missing`, `malformed`, `expired`,
/// `forged`): only with `forward_auth.identity_secret` set.
pub const IDENTITY_CHECKS_TOTAL: &str = "palisade_identity_checks_total";
/// 1, labelled with the `version` of this build.
pub const BUILD_INFO: &str = "palisade_build_info";
/// Checks asked again of the canary policy, by live `class`, deciding `scope` and `outcome`
/// (`same`, `would_refuse`, `would_allow`; `skipped` when 1024 were already on their way).
pub const CANARY_DECISIONS_TOTAL: &str = "palisade_canary_decisions_total";
/// Limit checks written to the traffic record.
pub const RECORD_CHECKS_TOTAL: &str = "palisade_record_checks_total";
/// Limit checks not recorded (`record.max_buffered` reached, or the write failed).
pub const RECORD_DROPPED_TOTAL: &str = "palisade_record_dropped_total";
/// Entries written to the decision history (each counts one key's refusals in a window).
pub const HISTORY_ENTRIES_TOTAL: &str = "palisade_history_entries_total";
/// Refused or challenged decisions not kept in the history (`history.max_pending` reached,
/// or the durable store failed when the window was written).
pub const HISTORY_DROPPED_TOTAL: &str = "palisade_history_dropped_total";
/// Times the service-wide login guard turned on (`lockout.stuffing`).
pub const LOGIN_GUARD_ACTIVATIONS_TOTAL: &str = "palisade_login_guard_activations_total";
/// 1 while the service-wide login guard is on, else 0.
pub const LOGIN_GUARD_ACTIVE: &str = "palisade_login_guard_active";
/// Login challenges issued to contexts their accounts did not know while the login guard
/// was on or their network was blocked (`event="issued"`), and reported passed
/// (`event="passed"`).
pub const LOGIN_CHALLENGES_TOTAL: &str = "palisade_login_challenges_total";
/// Network and ASN blocks renewed because their spraying went on while blocked.
pub const NETWORK_BLOCK_RENEWALS_TOTAL: &str = "palisade_network_block_renewals_total";

/// Every metric name, for the dashboard test.
pub const ALL: &[&str] = &[
    BUILD_INFO,
    LOGIN_GUARD_ACTIVATIONS_TOTAL,
    LOGIN_GUARD_ACTIVE,
    LOGIN_CHALLENGES_TOTAL,
    NETWORK_BLOCK_RENEWALS_TOTAL,
    HISTORY_ENTRIES_TOTAL,
    HISTORY_DROPPED_TOTAL,
    RECORD_CHECKS_TOTAL,
    RECORD_DROPPED_TOTAL,
    CANARY_DECISIONS_TOTAL,
    IDENTITY_CHECKS_TOTAL,
    HTTP_REQUESTS_TOTAL,
    HTTP_REQUEST_DURATION_SECONDS,
    STORE_UNAVAILABLE_TOTAL,
    HOT_STORE_HEALTHY,
    HOT_STORE_RECONNECTS_TOTAL,
    REGION_CHANGES_TOTAL,
    REGION_LEASED_KEYS,
    ACCESS_CHECKS_TOTAL,
    ACCESS_STALE_TOTAL,
    BOOTSTRAP_USES_TOTAL,
    LIMIT_DECISIONS_TOTAL,
    LIMIT_REMAINING_RATIO,
    REDIS_LATENCY_SECONDS,
    FAIL_OPEN_TOTAL,
    LIMIT_L1_HITS_TOTAL,
    LIMIT_COALESCED_CHECKS,
    SCORING_FACTORS_TOTAL,
    MULTIPLIER_PUBLISHES_TOTAL,
    ANOMALIES_TOTAL,
    OFFENDERS_TOTAL,
    ALERTS_TOTAL,
    ALERT_DELIVERIES_TOTAL,
    TELEMETRY_EVENTS_TOTAL,
    INGEST_LAG_SECONDS,
    BASELINE_KEYS,
    ATTESTATIONS_TOTAL,
    GRPC_REQUESTS_TOTAL,
    GRPC_REQUEST_SECONDS,
    ENVOY_RULE_HITS_TOTAL,
    ENVOY_CONFIG_LOADS_TOTAL,
    FORWARD_AUTH_TOTAL,
    CROWDSEC_PULLS_TOTAL,
    HOT_REBUILDS_TOTAL,
    HOT_REBUILDING,
    HOT_REBUILD_SECONDS,
    FACTOR_PERSIST_FAILURES_TOTAL,
];

/// Metric handles by their label values, for the metrics every request records.
///
/// `metrics::counter!` with labels builds the key, hashes it and looks it up in the
/// recorder's registry on every call (allocating the labels); a handle found here is one
/// lookup in a map that is replaced, never locked, when a handle is added (a read lock's
/// count is one cache line every worker writes to, for every metric of every request). A
/// handle is registered on its first use, so with the recorder in force then (requests come
/// after `App::build` installed it).
pub struct Handles<K, H> {
    map: arc_swap::ArcSwap<std::collections::HashMap<K, H, foldhash::fast::RandomState>>,
}

impl<K: std::hash::Hash + Eq + Copy, H: Clone> Handles<K, H> {
    /// An empty cache.
    pub fn new() -> Self {
        Handles {
            map: arc_swap::ArcSwap::from_pointee(std::collections::HashMap::default()),
        }
    }

    /// Runs `use_it` on the handle of `key`, registering it with `make` the first time.
    pub fn with(&self, key: K, make: impl FnOnce() -> H, use_it: impl FnOnce(&H)) {
        let map = self.map.load();
        if let Some(handle) = map.get(&key) {
            return use_it(handle);
        }
        drop(map);
        let handle = make();
        use_it(&handle);
        self.map.rcu(|map| {
            let mut map = std::collections::HashMap::clone(map);
            map.insert(key, handle.clone());
            map
        });
    }
}

impl<K: std::hash::Hash + Eq + Copy, H: Clone> Default for Handles<K, H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, H> std::fmt::Debug for Handles<K, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handles")
    }
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often buffered histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

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
            // Histogram samples are buffered until upkeep folds them into their buckets; a
            // scrape does it too, but nothing may scrape (embedded use), and a flood of
            // requests would then grow memory without bound. Fold them every 5 s.
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".to_owned())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_INTERVAL);
                        upkeep.run_upkeep();
                    }
                });
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
    metrics::describe_gauge!(
        HOT_STORE_HEALTHY,
        "1 while the hot store answers enforcement's commands, 0 after three failures in a row"
    );
    metrics::describe_counter!(
        HOT_STORE_RECONNECTS_TOTAL,
        "Redis Cluster connections rebuilt from the seed nodes because commands kept failing"
    );
    metrics::describe_counter!(
        REGION_CHANGES_TOTAL,
        "Changes made in another region applied to this region's hot store, by kind"
    );
    metrics::describe_gauge!(
        REGION_LEASED_KEYS,
        "Keys of the global budgets this instance holds a leased share of"
    );
    metrics::describe_counter!(ACCESS_CHECKS_TOTAL, "API-token authentications by outcome");
    metrics::describe_counter!(
        BOOTSTRAP_USES_TOTAL,
        "Uses of the bootstrap token by outcome (refused once an admin token exists or it expired)"
    );
    metrics::describe_counter!(
        ACCESS_STALE_TOTAL,
        "Token refreshes that failed (database unreachable): verdicts served from the cache"
    );
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
    metrics::describe_histogram!(
        LIMIT_COALESCED_CHECKS,
        "Limit checks per Redis script call (coalesced)"
    );
    metrics::describe_counter!(
        SCORING_FACTORS_TOTAL,
        "Factors stored by push signals, enforced or shadow"
    );
    metrics::describe_counter!(
        MULTIPLIER_PUBLISHES_TOTAL,
        "Multiplier publishes, written or superseded"
    );
    metrics::describe_counter!(ANOMALIES_TOTAL, "Keys found far above their baseline");
    metrics::describe_counter!(OFFENDERS_TOTAL, "Keys that became repeat offenders");
    metrics::describe_counter!(ALERTS_TOTAL, "Alerts raised");
    metrics::describe_counter!(
        ALERT_DELIVERIES_TOTAL,
        "Alert webhook deliveries by outcome"
    );
    metrics::describe_counter!(TELEMETRY_EVENTS_TOTAL, "Request-telemetry events ingested");
    metrics::describe_histogram!(
        INGEST_LAG_SECONDS,
        metrics::Unit::Seconds,
        "Time between an event's timestamp and its ingestion"
    );
    metrics::describe_gauge!(BASELINE_KEYS, "Keys tracked by the anomaly baselines");
    metrics::describe_gauge!(BUILD_INFO, "1, labelled with the version of this build");
    metrics::describe_counter!(
        IDENTITY_CHECKS_TOTAL,
        "Signed identities checked, by outcome"
    );
    metrics::describe_counter!(
        HISTORY_ENTRIES_TOTAL,
        "Entries written to the decision history"
    );
    metrics::describe_counter!(
        RECORD_CHECKS_TOTAL,
        "Limit checks written to the traffic record"
    );
    metrics::describe_counter!(RECORD_DROPPED_TOTAL, "Limit checks not recorded");
    metrics::describe_counter!(
        CANARY_DECISIONS_TOTAL,
        "Checks asked again of the canary policy, by class, scope and outcome"
    );
    metrics::describe_counter!(
        HISTORY_DROPPED_TOTAL,
        "Refused or challenged decisions not kept in the decision history"
    );
    metrics::describe_counter!(
        LOGIN_GUARD_ACTIVATIONS_TOTAL,
        "Times the service-wide login guard turned on"
    );
    metrics::describe_counter!(
        LOGIN_CHALLENGES_TOTAL,
        "Login challenges issued to unknown contexts under the login guard or a network block, and passed"
    );
    metrics::describe_gauge!(
        LOGIN_GUARD_ACTIVE,
        "1 while the service-wide login guard refuses logins from unknown contexts"
    );
    metrics::describe_counter!(
        NETWORK_BLOCK_RENEWALS_TOTAL,
        "Network and ASN spraying blocks renewed while their spraying went on"
    );
    metrics::describe_counter!(
        ATTESTATIONS_TOTAL,
        "Attestation submissions by platform and outcome (level or rejection code)"
    );
    metrics::describe_counter!(
        GRPC_REQUESTS_TOTAL,
        "Envoy rate limit service calls by outcome"
    );
    metrics::describe_histogram!(
        GRPC_REQUEST_SECONDS,
        metrics::Unit::Seconds,
        "Time to answer an Envoy rate limit service call"
    );
    metrics::describe_counter!(
        ENVOY_RULE_HITS_TOTAL,
        "Descriptors matched by an envoyproxy/ratelimit rule, by domain, rule and outcome"
    );
    metrics::describe_counter!(
        ENVOY_CONFIG_LOADS_TOTAL,
        "Loads of the envoyproxy/ratelimit config files by outcome"
    );
    metrics::describe_counter!(FORWARD_AUTH_TOTAL, "Forward-auth answers by outcome");
    metrics::describe_counter!(CROWDSEC_PULLS_TOTAL, "CrowdSec decision stream pulls");
    metrics::describe_counter!(
        HOT_REBUILDS_TOTAL,
        "Rebuilds of the hot store's enforcement state from the durable store, by outcome"
    );
    metrics::describe_gauge!(
        HOT_REBUILDING,
        "1 while the hot store's enforcement state is being rebuilt"
    );
    metrics::describe_gauge!(
        HOT_REBUILD_SECONDS,
        metrics::Unit::Seconds,
        "Duration of the last rebuild of the hot store"
    );
    metrics::describe_counter!(
        FACTOR_PERSIST_FAILURES_TOTAL,
        "Scoring factors enforced without a durable copy (the durable store failed)"
    );
}

/// `process_*` metrics (CPU, memory, open files), refreshed at each scrape.
fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let collector = metrics_process::Collector::default();
        collector.describe();
        collector
    })
}

/// The exposition of this process: its metrics and the `process_*` ones.
pub fn render(handle: &PrometheusHandle) -> String {
    process_collector().collect();
    handle.render()
}

/// Every series whose labels are known without the settings exists from then on, at zero:
/// a dashboard shows 0, not "no data" (the classes' own series:
/// `limiter::Budgets::zero_metrics`).
pub fn zero() {
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    // Healthy until the hot store's commands fail (store::health).
    metrics::gauge!(HOT_STORE_HEALTHY).set(1.0);
    metrics::counter!(HOT_STORE_RECONNECTS_TOTAL).increment(0);
    metrics::gauge!(REGION_LEASED_KEYS).set(0.0);
    let labelled: [(&'static str, &'static str, &[&'static str]); 12] = [
        (STORE_UNAVAILABLE_TOTAL, "store", &["durable", "hot"]),
        (
            ACCESS_CHECKS_TOTAL,
            "outcome",
            &["ok", "missing", "unknown", "forbidden"],
        ),
        (BOOTSTRAP_USES_TOTAL, "outcome", &["accepted", "refused"]),
        (
            GRPC_REQUESTS_TOTAL,
            "outcome",
            &["ok", "over_limit", "error"],
        ),
        (FORWARD_AUTH_TOTAL, "outcome", &["pass", "block"]),
        (ENVOY_CONFIG_LOADS_TOTAL, "outcome", &["loaded", "failed"]),
        (CROWDSEC_PULLS_TOTAL, "startup", &["true", "false", "live"]),
        (
            MULTIPLIER_PUBLISHES_TOTAL,
            "outcome",
            &["written", "superseded"],
        ),
        (
            ALERTS_TOTAL,
            "kind",
            &["anomaly", "repeat_offender", "spraying", "lockout"],
        ),
        (
            ALERT_DELIVERIES_TOTAL,
            "outcome",
            &["delivered", "failed", "gave_up"],
        ),
        (HOT_REBUILDS_TOTAL, "outcome", &["done", "failed"]),
        (
            IDENTITY_CHECKS_TOTAL,
            "outcome",
            &["valid", "missing", "malformed", "expired", "forged"],
        ),
    ];
    for (name, label, values) in labelled {
        for value in values {
            metrics::counter!(name, label => *value).increment(0);
        }
    }
    for kind in ["ip", "user", "device"] {
        metrics::counter!(ANOMALIES_TOTAL, "kind" => kind).increment(0);
        metrics::counter!(OFFENDERS_TOTAL, "kind" => kind).increment(0);
    }
    for event in ["issued", "passed"] {
        metrics::counter!(LOGIN_CHALLENGES_TOTAL, "event" => event).increment(0);
    }
    for name in [
        ACCESS_STALE_TOTAL,
        LIMIT_L1_HITS_TOTAL,
        TELEMETRY_EVENTS_TOTAL,
        FACTOR_PERSIST_FAILURES_TOTAL,
        HISTORY_ENTRIES_TOTAL,
        HISTORY_DROPPED_TOTAL,
        LOGIN_GUARD_ACTIVATIONS_TOTAL,
        NETWORK_BLOCK_RENEWALS_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
    metrics::gauge!(LOGIN_GUARD_ACTIVE).set(0.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Grafana dashboard only queries metrics this process exports.
    #[test]
    fn the_dashboard_uses_only_exported_metric_names() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grafana/palisade.json");
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard exists"))
                .expect("dashboard is JSON");
        let mut used = Vec::new();
        for panel in dashboard["panels"].as_array().expect("panels") {
            for target in panel["targets"].as_array().expect("targets") {
                let expr = target["expr"].as_str().expect("expr");
                let mut rest = expr;
                while let Some(at) = rest.find("palisade_") {
                    let name: String = rest[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    rest = &rest[at + name.len()..];
                    used.push(name);
                }
            }
        }
        assert!(used.len() >= 10, "{used:?}");
        for name in &used {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            assert!(
                ALL.contains(&base),
                "the dashboard queries {name}, which is not exported"
            );
        }
        for required in [
            LIMIT_DECISIONS_TOTAL,
            LIMIT_REMAINING_RATIO,
            OFFENDERS_TOTAL,
            FAIL_OPEN_TOTAL,
        ] {
            assert!(
                used.iter().any(|u| u.starts_with(required)),
                "{required} missing"
            );
        }
    }
}
