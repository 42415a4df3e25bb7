//! Signals over several instances: a spike whose requests a load balancer spreads over two
//! instances is one anomaly and one alert, as on one instance.

use super::*;

/// A device at 120x its baseline, its history and its burst split evenly over two instances
/// on one Postgres and one Redis: exactly one alert, and the device is tightened on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_spike_split_over_two_instances_raises_one_alert() {
    let Some(first) = TestApp::spawn(crate::helpers::Backend::Production).await else {
        return;
    };
    let second = first.another_instance().await;
    let now = first.now_ms();
    let events = history("192.0.2.10", ("device_id", "dev-split"), now, 15, 10);
    for (i, chunk) in events.chunks(15).enumerate() {
        let instance = if i % 2 == 0 { &first } else { &second };
        let answer = instance.post_requests(&json!({ "events": chunk })).await;
        assert_eq!(answer["anomalies"], 0);
    }
    let burst: Vec<Value> = (0..1200)
        .map(|_| json!({"ts": ts(now), "ip": "198.18.0.1", "device_id": "dev-split", "endpoint": "/v1/feed", "status": 200}))
        .collect();
    let (half_a, half_b) = (
        json!({ "events": &burst[..600] }),
        json!({ "events": &burst[600..] }),
    );
    let (a, b) = tokio::join!(first.post_requests(&half_a), second.post_requests(&half_b));
    let raised = a["anomalies"].as_u64().unwrap() + b["anomalies"].as_u64().unwrap();
    assert!(raised >= 1, "the spike is seen: {a} {b}");
    let alerts = first.alerts("?kind=anomaly").await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["subject"], "device:dev-split");
    for instance in [&first, &second] {
        let view = instance
            .multipliers("device_id=dev-split&endpoint=/v1/feed")
            .await;
        assert_eq!(
            view["keys"]["device:dev-split"]["multiplier"], 0.25,
            "{view}"
        );
    }
}
