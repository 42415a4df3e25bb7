//! A real nginx (Debian package) on loopback in front of a tiny upstream, asking Palisade's
//! forward-auth endpoint through `auth_request`: requests pass with the rate-limit headers
//! until the budget is spent, then nginx answers 429 with `Retry-After`. The configuration
//! is the documented snippet, `docs/gateways/nginx.conf`: what a client sends as its own
//! identity or original request never reaches Palisade.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{Backend, TestApp};

/// The nginx binary, or None (a loud skip locally; a failure in CI).
fn nginx_binary() -> Option<PathBuf> {
    let found = ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but nginx is not installed (.ci/run installs it)"
        );
        eprintln!("SKIPPED (no nginx): apt-get install nginx to run the nginx forward-auth test");
    }
    found
}

/// A running nginx, stopped (by PID) on drop.
struct Nginx {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    /// SIGTERM to the master (fast shutdown: it stops its workers, then exits); SIGKILL
    /// would leave the workers running.
    fn drop(&mut self) {
        let terminated = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if terminated {
            for _ in 0..100 {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What differs between the documented configurations.
struct Variant {
    /// The snippet under `docs/gateways/`.
    snippet: &'static str,
    /// Lines of the main context.
    main: String,
    /// Lines of the `http` block.
    http: String,
    /// Text of the snippet replaced for this run (what a site sets from its own
    /// authentication).
    edits: Vec<(&'static str, &'static str)>,
}

impl Variant {
    fn plain() -> Self {
        Variant {
            snippet: "docs/gateways/nginx.conf",
            main: String::new(),
            http: String::new(),
            edits: Vec::new(),
        }
    }

    /// The signed-identity snippet with nginx's JavaScript `module` loaded and
    /// `palisade_identity.js` imported.
    fn signed(module: &Path, edits: Vec<(&'static str, &'static str)>) -> Self {
        let js = crate::helpers::repo_file("docs/gateways/palisade_identity.js");
        Variant {
            snippet: "docs/gateways/nginx-identity.conf",
            main: format!(
                "load_module {};\nenv PALISADE_IDENTITY_SECRET;",
                module.display()
            ),
            http: format!(
                "    js_path {};\n    js_import palisade from palisade_identity.js;\n    js_set $palisade_identity palisade.identity;",
                js.parent().unwrap().display()
            ),
            edits,
        }
    }
}

/// A documented snippet in a server of this test's ports.
fn config(
    dir: &Path,
    port: u16,
    upstream: u16,
    palisade: u16,
    token: &str,
    variant: &Variant,
) -> String {
    let d = dir.display();
    let snippet = std::fs::read_to_string(crate::helpers::repo_file(variant.snippet))
        .expect("the documented snippet")
        .replace("PALISADE", &format!("127.0.0.1:{palisade}"))
        .replace("LIMITER_TOKEN", token)
        .replace("HTPASSWD", &format!("{d}/htpasswd"))
        .replace("APP", &format!("127.0.0.1:{upstream}"));
    let snippet = variant.edits.iter().fold(snippet, |text, (from, to)| {
        assert!(text.contains(from), "{from} is in {}", variant.snippet);
        text.replace(from, to)
    });
    let (main, http) = (&variant.main, &variant.http);
    format!(
        r#"
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
{main}
events {{ worker_connections 64; }}
http {{
    access_log off;
{http}
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;

    server {{
        listen 127.0.0.1:{port};
{snippet}
    }}
}}
"#
    )
}

async fn start_upstream() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().fallback(|| async { "upstream ok" });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    port
}

async fn start_nginx(
    binary: &Path,
    upstream: u16,
    palisade: u16,
    token: &str,
    variant: &Variant,
    env: &[(&str, &str)],
) -> Nginx {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        config(dir.path(), port, upstream, palisade, token, variant),
    )
    .unwrap();
    // alice's password for the basic-auth variant (nginx reads the {PLAIN} scheme).
    std::fs::write(dir.path().join("htpasswd"), "alice:{PLAIN}wonderland\n").unwrap();
    let mut command = Command::new(binary);
    command.envs(env.iter().copied());
    command
        .args([
            "-p",
            dir.path().to_str().unwrap(),
            "-c",
            conf.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Workers run as the master's user when it is not root; as root, stay root so they can
    // use the temp folders. One -g only: nginx keeps the last one, and without `daemon off`
    // it would fork away from the PID we stop.
    let is_root =
        std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
    let globals = if is_root {
        "daemon off; user root;"
    } else {
        "daemon off;"
    };
    command.args(["-g", globals]);
    let child = command.spawn().expect("start nginx");
    let nginx = Nginx {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return nginx;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(nginx._dir.path().join("error.log")).unwrap_or_default();
    panic!("nginx did not start on port {port}: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_passes_then_blocks_with_headers() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let (_, token) = app.create_token("limiter", "nginx").await;
    let palisade_port = crate::helpers::socket_of(&app.base).port();
    let upstream = start_upstream().await;
    let nginx = start_nginx(
        &binary,
        upstream,
        palisade_port,
        &token,
        &Variant::plain(),
        &[],
    )
    .await;
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/auth/login", nginx.port);
    let master = nginx.child.id();
    // The client claims to be someone, to come from elsewhere, and to ask for a read: none of
    // it reaches Palisade (the victim's budget stays whole, the request is auth from here).
    let spoofed = |request: reqwest::RequestBuilder| {
        request
            .header("x-user-id", "victim")
            .header("x-device-id", "victim-phone")
            .header("x-forwarded-uri", "/v1/feed")
            .header("x-forwarded-method", "GET")
            .header("x-original-uri", "/v1/feed")
            .header("x-forwarded-for", "192.0.2.1")
            .header("forwarded", "for=192.0.2.2")
            .header("x-real-ip", "192.0.2.3")
    };
    // The auth class: 10 logins a minute per IP (unauthenticated).
    for n in 1..=10u32 {
        let response = spoofed(client.post(&url)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        assert_eq!(response.headers()["x-ratelimit-limit"], "10");
        assert_eq!(
            response.headers()["x-ratelimit-remaining"],
            (10 - n).to_string().as_str()
        );
        assert_eq!(response.text().await.unwrap(), "upstream ok");
    }
    let blocked = spoofed(client.post(&url)).send().await.unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = blocked.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=6).contains(&retry_after), "{retry_after}");
    assert_eq!(blocked.headers()["x-ratelimit-remaining"], "0");
    let body: serde_json::Value = blocked.json().await.unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    // The victim's own auth budget was never touched (5 a minute, all left).
    let victim = app
        .limit_check(
            &serde_json::json!({"endpoint": "/auth/login", "method": "POST",
            "ip": "198.51.100.1", "user_id": "victim", "consume": false}),
        )
        .await;
    assert_eq!(victim.status(), StatusCode::OK);
    let victim: serde_json::Value = victim.json().await.unwrap();
    assert_eq!(victim["remaining"], 5, "{victim}");
    // Reads are another class with their own budget: they still pass.
    let read = client
        .get(format!("http://127.0.0.1:{}/v1/feed", nginx.port))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    // Stopped by PID, workers included: nothing serves the port any more.
    let port = nginx.port;
    drop(nginx);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nginx (master {master}) still serves port {port}"
    );
}

/// The signed-identity configuration (`docs/gateways/nginx-identity.conf` with
/// `palisade_identity.js` in nginx's JavaScript module): nginx authenticates alice, signs
/// her identity, and Palisade counts her own auth budget; an identity or user id the client
/// sends itself changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_signs_the_identity_it_authenticated_with_njs() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let module = Path::new("/usr/lib/nginx/modules/ngx_http_js_module.so");
    if !module.is_file() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but nginx's JavaScript module is not installed (.ci/run installs libnginx-mod-http-js)"
        );
        eprintln!("SKIPPED (no njs): apt-get install libnginx-mod-http-js");
        return;
    }
    const SECRET: &str = "nginx-signs-identities-with-this-32-byte-secret";
    let first = TestApp::spawn_with(Backend::Embedded, |s| {
        s.forward_auth.identity_secret = vec![palisade::config::Secret::new(SECRET)];
        s.limits.budgets.push(crate::helpers::partner_budget(6));
    })
    .await
    .unwrap();
    // njs signs with the real time: this instance's clock reads it too.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let app = first.another_instance_with_wall_clock(now_ms).await;
    let (_, token) = app.create_token("limiter", "nginx").await;
    let palisade_port = crate::helpers::socket_of(&app.base).port();
    let upstream = start_upstream().await;
    // This site knows each user's app: the tenant is signed too (a v2 identity).
    let variant = Variant::signed(
        module,
        vec![(
            r#"set $palisade_tenant "";"#,
            r#"set $palisade_tenant "$remote_user-app";"#,
        )],
    );
    let nginx = start_nginx(
        &binary,
        upstream,
        palisade_port,
        &token,
        &variant,
        &[("PALISADE_IDENTITY_SECRET", SECRET)],
    )
    .await;
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{}/auth/login", nginx.port);
    // Without credentials nginx answers before Palisade is asked.
    let anonymous = client.post(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    // alice, who also claims to be the victim in every header Palisade could read.
    // Signed with the real secret: were it to reach Palisade, it would count as the victim.
    let secret = palisade::config::Secret::new(SECRET);
    let now_s = app.app.clock.now_ms() / 1000;
    let forged = palisade::access::identity::sign(&secret, now_s + 60, Some("victim"), None, None);
    let as_alice = || {
        client
            .post(&url)
            .basic_auth("alice", Some("wonderland"))
            .header("x-palisade-identity", &forged)
            .header("x-user-id", "victim")
    };
    // Her own login budget: 5 a minute per account (the IP allows 10).
    for n in 1..=5u32 {
        let response = as_alice().send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        assert_eq!(
            response.headers()["x-ratelimit-limit"],
            "5",
            "alice's budget"
        );
    }
    let blocked = as_alice().send().await.unwrap();
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    // The victim's budget is whole: nginx replaced the client's identity with alice's.
    let victim = app
        .limit_check(
            &serde_json::json!({"endpoint": "/auth/login", "method": "POST",
            "ip": "198.51.100.1", "identity": forged,
            "consume": false}),
        )
        .await;
    let victim: serde_json::Value = victim.json().await.unwrap();
    assert_eq!(victim["remaining"], 5, "{victim}");
    // Her reads count against her app's tenant budget: nginx signed the tenant it set.
    let feed = format!("http://127.0.0.1:{}/api/feed", nginx.port);
    for _ in 0..2 {
        let response = client
            .get(&feed)
            .basic_auth("alice", Some("wonderland"))
            .header("x-tenant-id", "someone-elses-app")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let tenant_only =
        palisade::access::identity::sign(&secret, now_s + 60, None, None, Some("alice-app"));
    let app_budget = app
        .limit_check(
            &serde_json::json!({"endpoint": "/api/feed", "method": "GET",
            "ip": "198.51.100.2", "identity": tenant_only, "consume": false}),
        )
        .await;
    let app_budget: serde_json::Value = app_budget.json().await.unwrap();
    assert_eq!(
        (&app_budget["scope"], &app_budget["remaining"]),
        (&serde_json::json!("tenant"), &serde_json::json!(4)),
        "{app_budget}"
    );
    drop(nginx);
}

/// Every documented nginx configuration, with a client that sends every header Palisade
/// reads (identity, tenant, signed identity, original request, addresses): what reaches
/// Palisade's place holds none of the client's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_documented_nginx_config_passes_a_client_claim_to_palisade() {
    let Some(binary) = nginx_binary() else {
        return;
    };
    let module = Path::new("/usr/lib/nginx/modules/ngx_http_js_module.so");
    let mut variants = vec![(Variant::plain(), Vec::new())];
    if module.is_file() {
        variants.push((
            Variant::signed(module, Vec::new()),
            vec![(
                "PALISADE_IDENTITY_SECRET",
                "a-secret-of-at-least-32-characters-long",
            )],
        ));
    } else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but nginx's JavaScript module is not installed"
        );
    }
    let upstream = start_upstream().await;
    for (variant, env) in variants {
        let recorder = crate::recorder::HeaderRecorder::start().await;
        let nginx = start_nginx(
            &binary,
            upstream,
            recorder.port,
            "limiter-token",
            &variant,
            &env,
        )
        .await;
        let mut request = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/auth/login", nginx.port))
            .basic_auth("alice", Some("wonderland"));
        for (name, value) in crate::recorder::CLIENT_CLAIMS {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{}", variant.snippet);
        recorder.assert_no_client_claims(variant.snippet);
    }
}
