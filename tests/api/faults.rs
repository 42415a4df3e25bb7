//! Faults under load: Postgres taken away while auth services post events. Every event
//! that got a 2xx is in Postgres afterwards; the outage answers 503, never a 500; ingest
//! recovers by itself once the database is back.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Mutex;

use crate::helpers::{ADMIN_TOKEN, Backend, ChaosProxy, TestApp, production_urls, socket_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_under_ingest_loses_no_acknowledged_event() {
    let Some((db_url, _)) = production_urls() else {
        return;
    };
    let proxy = ChaosProxy::start(socket_of(&db_url)).await;
    let database = crate::helpers::fresh_postgres(&db_url).await;
    let proxied = proxy.proxied_url(&database);
    let app = TestApp::spawn_with(Backend::Production, |settings| {
        settings.database_url = proxied;
        settings.store.db_timeout_ms = 300;
    })
    .await
    .expect("production configured");

    let acknowledged = Arc::new(Mutex::new(HashSet::<String>::new()));
    let outcomes = Arc::new(Mutex::new(Vec::<(Instant, u16)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut posters = Vec::new();
    for poster in 0..4 {
        let (client, url) = (app.client.clone(), app.url("/v1/events/auth"));
        let (acknowledged, outcomes, stop) = (acknowledged.clone(), outcomes.clone(), stop.clone());
        posters.push(tokio::spawn(async move {
            let mut batch = 0;
            while !stop.load(Ordering::SeqCst) {
                let ids: Vec<String> = (0..50)
                    .map(|i| format!("p{poster}-b{batch}-e{i}"))
                    .collect();
                let events: Vec<_> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| {
                        json!({"event_id": id, "type": "login_failure",
                        "account": format!("user-{poster}-{}", (batch * 50 + i) % 997),
                        "ip": format!("10.{poster}.{}.{}", batch % 250, i)})
                    })
                    .collect();
                let sent = client
                    .post(&url)
                    .bearer_auth(ADMIN_TOKEN)
                    .json(&json!({"events": events}))
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                let status = sent.map_or(0, |r| r.status().as_u16());
                if status == 200 {
                    acknowledged.lock().await.extend(ids);
                }
                outcomes.lock().await.push((Instant::now(), status));
                batch += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.break_connections();
    let broken_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.restore();
    let restored_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::SeqCst);
    for poster in posters {
        poster.await.unwrap();
    }

    let outcomes = outcomes.lock().await.clone();
    let statuses: HashSet<u16> = outcomes.iter().map(|(_, s)| *s).collect();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "only 200 and 503 (never a 500 or a dropped connection): {statuses:?}"
    );
    let during = outcomes
        .iter()
        .filter(|(at, _)| *at > broken_at + Duration::from_millis(400) && *at < restored_at);
    assert!(
        during.clone().count() > 0 && during.clone().all(|(_, s)| *s == 503),
        "requests during the outage answered 503"
    );
    let recovered = outcomes
        .iter()
        .find(|(at, s)| *at > restored_at && *s == 200)
        .map(|(at, _)| at.duration_since(restored_at))
        .expect("ingest recovered after the database came back");
    assert!(
        recovered < Duration::from_secs(2),
        "recovery took {recovered:?}"
    );

    // Every acknowledged event is stored (read straight from Postgres, not through the app).
    let acknowledged = acknowledged.lock().await.clone();
    assert!(
        acknowledged.len() >= 200,
        "enough traffic: {}",
        acknowledged.len()
    );
    let pool = sqlx::PgPool::connect(&database).await.unwrap();
    let stored: Vec<String> = sqlx::query_scalar("SELECT event_id FROM auth_events")
        .fetch_all(&pool)
        .await
        .unwrap();
    let stored: HashSet<String> = stored.into_iter().collect();
    let missing: Vec<&String> = acknowledged.difference(&stored).take(5).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged events are not stored, e.g. {missing:?}",
        acknowledged.difference(&stored).count()
    );
    eprintln!(
        "postgres outage: {} batches, {} events acknowledged and stored, recovered {recovered:?} after restore",
        outcomes.len(),
        acknowledged.len()
    );
}
