//! A real Caddy (Debian package) in front of a tiny upstream with the documented
//! `docs/gateways/Caddyfile`: the file validates, requests pass until the budget is spent,
//! then Caddy answers Palisade's 429, and what a client sends as its own identity or original
//! request never reaches Palisade.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{Backend, TestApp, repo_file};

/// The caddy binary, or None (a loud skip locally; a failure in CI).
fn caddy_binary() -> Option<PathBuf> {
    let found = ["/usr/bin/caddy", "/usr/local/bin/caddy"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but caddy is not installed (.ci/run installs it)"
        );
        eprintln!("SKIPPED (no caddy): apt-get install caddy to run the Caddy forward-auth test");
    }
    found
}

/// A running Caddy, stopped (by PID) on drop.
struct Caddy {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Caddy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The documented Caddyfile with this test's ports and token, and Caddy's own state kept in
/// `dir` (no admin endpoint, no automatic HTTPS on loopback).
fn caddyfile(port: u16, palisade: u16, upstream: u16, token: &str) -> String {
    let documented = std::fs::read_to_string(repo_file("docs/gateways/Caddyfile"))
        .expect("the documented Caddyfile")
        .replace(":8000", &format!("http://127.0.0.1:{port}"))
        .replace("PALISADE", &format!("127.0.0.1:{palisade}"))
        .replace("LIMITER_TOKEN", token)
        .replace("APP", &format!("127.0.0.1:{upstream}"));
    format!("{{\n\tadmin off\n\tauto_https off\n}}\n{documented}")
}

fn command(binary: &Path, dir: &tempfile::TempDir, verb: &str, file: &Path) -> Command {
    let mut command = Command::new(binary);
    command
        .args([
            verb,
            "--config",
            file.to_str().unwrap(),
            "--adapter",
            "caddyfile",
        ])
        .env("XDG_DATA_HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .env("HOME", dir.path());
    command
}

/// Caddy with the documented Caddyfile in front of `palisade` and `upstream`, validated and
/// started; stopped when dropped.
async fn start_caddy(binary: &Path, palisade: u16, upstream: u16, token: &str) -> Caddy {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("Caddyfile");
    std::fs::write(&file, caddyfile(port, palisade, upstream, token)).unwrap();
    let validated = command(binary, &dir, "validate", &file)
        .output()
        .expect("caddy validate");
    assert!(
        validated.status.success(),
        "caddy validate: {}",
        String::from_utf8_lossy(&validated.stderr)
    );
    let child = command(binary, &dir, "run", &file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start caddy");
    let caddy = Caddy {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", caddy.port)).is_ok() {
            return caddy;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("caddy did not start on {}", caddy.port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_forward_auth_passes_then_blocks_and_never_forwards_client_identity() {
    let Some(binary) = caddy_binary() else {
        return;
    };
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let (_, token) = app.create_token("limiter", "caddy").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "upstream ok" });
        let _ = axum::serve(listener, app).await;
    });
    let palisade = crate::helpers::socket_of(&app.base).port();
    let caddy = start_caddy(&binary, palisade, upstream, &token).await;

    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/auth/login", caddy.port);
    let spoofed = |request: reqwest::RequestBuilder| {
        crate::recorder::CLIENT_CLAIMS
            .iter()
            .fold(request, |request, (name, value)| {
                request.header(*name, *value)
            })
    };
    // The auth class: 10 logins a minute per IP (unauthenticated).
    for n in 1..=10u32 {
        let response = spoofed(client.post(&url)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        assert_eq!(response.text().await.unwrap(), "upstream ok");
    }
    let blocked = spoofed(client.post(&url)).send().await.unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(blocked.headers().contains_key("retry-after"));
    let body: serde_json::Value = blocked.json().await.unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    // The victim's own auth budget was never touched (5 a minute, all left).
    let victim: serde_json::Value = app
        .limit_check(
            &serde_json::json!({"endpoint": "/auth/login", "method": "POST",
            "ip": "198.51.100.1", "user_id": "victim", "consume": false}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(victim["remaining"], 5, "{victim}");
    let port = caddy.port;
    drop(caddy);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "caddy still serves port {port}"
    );
}

/// The documented Caddyfile with a client that sends every header Palisade reads: what
/// reaches Palisade's place holds none of the client's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_caddyfile_passes_no_client_claim_to_palisade() {
    let Some(binary) = caddy_binary() else {
        return;
    };
    let recorder = crate::recorder::HeaderRecorder::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "upstream ok" });
        let _ = axum::serve(listener, app).await;
    });
    let caddy = start_caddy(&binary, recorder.port, upstream, "limiter-token").await;
    let mut request =
        reqwest::Client::new().post(format!("http://127.0.0.1:{}/auth/login", caddy.port));
    for (name, value) in crate::recorder::CLIENT_CLAIMS {
        request = request.header(name, value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    recorder.assert_no_client_claims("docs/gateways/Caddyfile");
}
