//! Alerts delivered to webhooks: signed, and retried with backoff while a receiver is down.

use super::*;

on_both_backends!(
    webhooks_get_signed_alerts_and_a_down_receiver_is_retried,
    webhooks_name_accounts_by_pseudonym_when_asked,
);

/// Requests a receiver got: headers and body.
type Received = Arc<Mutex<Vec<(reqwest::header::HeaderMap, Vec<u8>)>>>;

/// A local webhook receiver recording what it gets.
struct Receiver {
    got: Received,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn receiver(listener: tokio::net::TcpListener) -> Receiver {
    let got: Received = Arc::default();
    let seen = got.clone();
    let router = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let mut copy = reqwest::header::HeaderMap::new();
                    for (name, value) in &headers {
                        copy.insert(
                            reqwest::header::HeaderName::from_bytes(name.as_str().as_bytes())
                                .unwrap(),
                            reqwest::header::HeaderValue::from_bytes(value.as_bytes()).unwrap(),
                        );
                    }
                    seen.lock().unwrap().push((copy, body.to_vec()));
                    "ok"
                }
            },
        ),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    Receiver { got, _stop: tx }
}

const SECRET: &str = "webhook-secret-0123456789";

/// Alerts reach configured webhooks signed with HMAC; a receiver that is down is retried
/// later and never holds up ingestion.
async fn webhooks_get_signed_alerts_and_a_down_receiver_is_retried(app: TestApp) {
    let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up_addr = up.local_addr().unwrap();
    let down_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let hook = |addr: std::net::SocketAddr, kinds: Vec<String>| palisade::config::WebhookSettings {
        url: format!("http://{addr}/hook"),
        secret: palisade::config::Secret::new(SECRET),
        kinds,
    };
    let app = app_with(app, |s| {
        s.scoring.webhooks = vec![
            hook(up_addr, vec![]),
            hook(down_addr, vec!["spraying".to_owned()]),
        ];
    })
    .await;
    let live = receiver(up).await;

    // Password spraying raises a `spraying` alert; the batch is answered without waiting
    // for any webhook.
    let events: Vec<Value> = (0..20)
        .map(|i| json!({"event_id": format!("w-{i}"), "type": "login_failure", "account": format!("user{i}"), "ip": "203.0.113.66"}))
        .collect();
    let started = std::time::Instant::now();
    let response = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({ "events": events }),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(5));

    let round = app.app.scoring.alerts().deliver_pending().await.unwrap();
    assert_eq!((round.delivered, round.failed), (1, 1), "{round:?}");
    let (headers, body) = live.got.lock().unwrap()[0].clone();
    let payload: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(payload["kind"], "spraying");
    assert_eq!(payload["subject"], "ip:203.0.113.66");
    let signature = headers["x-palisade-signature"].to_str().unwrap();
    let t: i64 = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        signature,
        palisade::scoring::alerts::signature(SECRET, t, &body)
    );
    assert_ne!(
        signature,
        palisade::scoring::alerts::signature("wrong-secret-0123456", t, &body)
    );
    assert_eq!(
        headers["x-palisade-alert-id"],
        payload["id"].as_str().unwrap()
    );

    // Not due again before its backoff.
    assert_eq!(
        app.app
            .scoring
            .alerts()
            .deliver_pending()
            .await
            .unwrap()
            .failed,
        0
    );
    // The second receiver comes up; after the backoff the delivery succeeds.
    let late = receiver(tokio::net::TcpListener::bind(down_addr).await.unwrap()).await;
    app.advance(Duration::from_millis(1100)).await;
    let round = app.app.scoring.alerts().deliver_pending().await.unwrap();
    assert_eq!(round.delivered, 1, "{round:?}");
    assert_eq!(late.got.lock().unwrap().len(), 1);
    assert_eq!(live.got.lock().unwrap().len(), 1, "delivered once");
}

/// With `privacy.pseudonymize`, a webhook learns that an account was locked but not which
/// one (a stable keyed pseudonym); analysts still see the account in clear.
async fn webhooks_name_accounts_by_pseudonym_when_asked(app: TestApp) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let privacy = palisade::config::PrivacySettings {
        pseudonym_key: Some(palisade::config::Secret::new("p".repeat(40))),
        pseudonymize: true,
        clear_logs: false,
    };
    let expected = palisade::telemetry::privacy::Pseudonyms::new(&privacy).of("ivy@example.com");
    let app = app_with(app, |s| {
        s.privacy = privacy;
        s.scoring.webhooks = vec![palisade::config::WebhookSettings {
            url: format!("http://{addr}/hook"),
            secret: palisade::config::Secret::new(SECRET),
            kinds: vec!["lockout".to_owned()],
        }];
    })
    .await;
    let live = receiver(listener).await;
    app.fail("pv", "ivy@example.com", &["203.0.113.12"], 10)
        .await;
    let round = app.app.scoring.alerts().deliver_pending().await.unwrap();
    assert_eq!(round.delivered, 1, "{round:?}");
    let (_, body) = live.got.lock().unwrap()[0].clone();
    let text = String::from_utf8(body).unwrap();
    assert!(
        !text.contains("ivy"),
        "the webhook names the account: {text}"
    );
    let payload: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(payload["subject"], format!("user:{expected}"));
    assert!(payload["message"].as_str().unwrap().starts_with(&expected));
    let alerts = app.admin_json("/v1/alerts?kind=lockout").await;
    assert_eq!(alerts["items"][0]["subject"], "user:ivy@example.com");
}
