//! A stand-in for Palisade behind a documented gateway config: it records the headers of
//! every request it gets and lets each one pass, so a test can see exactly what a client's
//! own headers turn into on the way.

use std::sync::{Arc, Mutex};

use axum::http::HeaderMap;

/// Every header Palisade reads from a gateway, with the value a spoofing client sends:
/// identity (the default header names, the signed identity), the original request and the
/// client address.
pub const CLIENT_CLAIMS: [(&str, &str); 11] = [
    ("x-user-id", "victim"),
    ("x-device-id", "victim-phone"),
    ("x-tenant-id", "someone-elses-tenant"),
    ("x-palisade-identity", "v1.forged.identity"),
    ("x-forwarded-uri", "/v1/feed"),
    ("x-forwarded-method", "GET"),
    ("x-original-uri", "/v1/feed"),
    ("x-original-method", "GET"),
    ("x-forwarded-for", "192.0.2.1"),
    ("forwarded", "for=192.0.2.2"),
    ("x-real-ip", "192.0.2.3"),
];

/// The recording stand-in.
pub struct HeaderRecorder {
    /// Its port on 127.0.0.1.
    pub port: u16,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
}

impl HeaderRecorder {
    /// Starts on a free loopback port; every request gets 200.
    pub async fn start() -> HeaderRecorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let record = record.clone();
            async move {
                record.lock().unwrap().push(headers);
                "pass"
            }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        HeaderRecorder { port, seen }
    }

    /// The headers of every request so far.
    pub fn seen(&self) -> Vec<HeaderMap> {
        self.seen.lock().unwrap().clone()
    }

    /// Asserts that requests arrived and that none carried a client's claim: each header of
    /// [`CLIENT_CLAIMS`] is absent or the gateway's own value, and the identity headers
    /// Palisade reads by default (`ForwardAuthSettings::default()`) are among them.
    #[track_caller]
    pub fn assert_no_client_claims(&self, gateway: &str) {
        let seen = self.seen();
        assert!(
            !seen.is_empty(),
            "{gateway}: no request reached the stand-in"
        );
        let defaults = palisade::config::ForwardAuthSettings::default();
        for name in [
            defaults.user_header.as_str(),
            defaults.device_header.as_str(),
            defaults.tenant_header.as_str(),
            palisade::access::identity::HEADER,
        ] {
            assert!(
                CLIENT_CLAIMS
                    .iter()
                    .any(|(claim, _)| claim.eq_ignore_ascii_case(name)),
                "{name} is a header Palisade reads: the spoofing client sends it too"
            );
        }
        for headers in &seen {
            for (name, claimed) in CLIENT_CLAIMS {
                for value in headers.get_all(name) {
                    let value = value.to_str().unwrap_or("");
                    assert!(
                        !value.contains(claimed),
                        "{gateway} passed the client's own {name}: {value:?}"
                    );
                }
            }
        }
    }
}
