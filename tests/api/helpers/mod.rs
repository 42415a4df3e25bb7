//! `TestApp`: one Palisade per test on `127.0.0.1:0`, on either backend, plus helpers.
//!
//! Embedded: a fresh SQLite file and in-process hot store. Production: a fresh Postgres
//! database copied from a migrated template, and a per-test Redis key prefix. URLs come from
//! `PALISADE_TEST_DATABASE_URL` / `PALISADE_TEST_REDIS_URL`; in CI (`CI=true`) a missing
//! one fails the test, locally it is skipped with a loud message.

#![allow(dead_code, reason = "each test module uses a different subset")]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use palisade::clock::{Clock, ManualClock, SystemClock};
use palisade::config::Secret;
use palisade::{App, Settings};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::Connection;
use tokio::sync::OnceCell;

mod processes; // what tests start beside the app: proxies, Redis servers and clusters, the binary
pub use processes::*;

/// The bootstrap (admin) token of every test app.
pub const ADMIN_TOKEN: &str = "test-bootstrap-token-0123456789";

/// Which backends a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite + in-process.
    Embedded,
    /// Postgres + Redis.
    Production,
}

/// Writes each behaviour test once and runs it on both backends:
/// `on_both_backends!(name, …)` expands to `embedded::name` and `production::name`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let app = $crate::helpers::TestApp::spawn($crate::helpers::Backend::Embedded)
                        .await
                        .expect("embedded backend always exists");
                    super::$name(app).await;
                }
            )*
        }
        mod production {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(
                    not(production_tests),
                    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
                )]
                async fn $name() {
                    if let Some(app) = $crate::helpers::TestApp::spawn($crate::helpers::Backend::Production).await {
                        super::$name(app).await;
                    }
                }
            )*
        }
    };
}

/// URLs of the production services, or `None` (locally) when unset.
///
/// In CI a missing variable is a failure, as DEVELOPERS.md requires.
pub fn production_urls() -> Option<(String, String)> {
    let db = std::env::var("PALISADE_TEST_DATABASE_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let redis = std::env::var("PALISADE_TEST_REDIS_URL")
        .ok()
        .filter(|v| !v.is_empty());
    match (db, redis) {
        (Some(db), Some(redis)) => Some((db, redis)),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!(
                "CI=true but PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL are not both set"
            )
        }
        _ => {
            eprintln!(
                "SKIPPED (no Postgres/Redis): set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL to run the production backend"
            );
            None
        }
    }
}

/// Replaces the database name of a Postgres URL.
fn with_database(url: &str, database: &str) -> String {
    let mut parsed = reqwest::Url::parse(url).expect("PALISADE_TEST_DATABASE_URL is a URL");
    parsed.set_path(&format!("/{database}"));
    parsed.to_string()
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// Creates (once per test process) a migrated template database and returns its name.
/// Old test databases of earlier runs are dropped first.
async fn template(admin_url: &str) -> String {
    TEMPLATE
        .get_or_init(|| async {
            let mut admin = sqlx::PgConnection::connect(admin_url).await.expect("connect to PALISADE_TEST_DATABASE_URL");
            let stale: Vec<(String,)> = sqlx::query_as(
                "SELECT datname FROM pg_database WHERE datname LIKE 'pal\\_t\\_%' OR datname LIKE 'pal\\_tpl\\_%'",
            )
            .fetch_all(&mut admin)
            .await
            .expect("list databases");
            // Only databases of runs older than an hour: a concurrent test run's are left alone
            // (names end in a ULID, which carries its creation time).
            let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
            let stale = stale.into_iter().filter(|(name,)| {
                name.rsplit('_')
                    .next()
                    .and_then(|id| ulid::Ulid::from_string(&id.to_uppercase()).ok())
                    .is_none_or(|id| id.datetime() < hour_ago)
            });
            for (name,) in stale {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
                    .execute(&mut admin)
                    .await;
            }
            let name = format!("pal_tpl_{}", ulid::Ulid::new().to_string().to_lowercase());
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
                .execute(&mut admin)
                .await
                .expect("create template database");
            let durable = palisade::store::Durable::connect(&with_database(admin_url, &name), 1, std::time::Duration::from_secs(10))
                .await
                .expect("connect to template");
            durable.migrate().await.expect("migrate template");
            durable.close().await;
            name
        })
        .await
        .clone()
}

/// A fresh Postgres database (copy of the migrated template); returns its URL.
pub async fn fresh_postgres(admin_url: &str) -> String {
    let template = template(admin_url).await;
    let name = format!("pal_t_{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .expect("connect");
    let mut attempt = 0;
    loop {
        let created = sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
        )))
        .execute(&mut admin)
        .await;
        match created {
            Ok(_) => break,
            // Two copies of one template at the same instant can collide; try again.
            Err(err) if attempt < 20 => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                let _ = err;
            }
            Err(err) => panic!("create test database: {err}"),
        }
    }
    with_database(admin_url, &name)
}

/// One running Palisade.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Shared HTTP client.
    pub client: reqwest::Client,
    /// The backend it runs on.
    pub backend: Backend,
    /// The settings it was built with.
    pub settings: Settings,
    /// The app itself, for calling domain services directly.
    pub app: palisade::AppState,
    /// Embedded apps run on a manual clock that only [`TestApp::advance`] moves; production
    /// apps use the real clock (Redis `TIME` decides there).
    pub clock: Option<ManualClock>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: Arc<tempfile::TempDir>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Settings for a test on `backend` (None: production services not configured).
pub async fn test_settings(backend: Backend, dir: &tempfile::TempDir) -> Option<Settings> {
    let mut settings = Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        bootstrap_token: Some(Secret::new(ADMIN_TOKEN)),
        data_dir: PathBuf::from(dir.path()),
        ..Settings::default()
    };
    settings.store.redis_key_prefix =
        format!("t{}", &ulid::Ulid::new().to_string().to_lowercase()[16..]);
    match backend {
        Backend::Embedded => {
            settings.database_url =
                format!("sqlite://{}", dir.path().join("palisade.db").display());
            settings.redis_url = None;
        }
        Backend::Production => {
            let (db, redis) = production_urls()?;
            settings.database_url = fresh_postgres(&db).await;
            settings.redis_url = Some(redis);
            // Tests run two at a time with up to three instances each, against a server
            // with 100 connections: small pools keep the suite well under it.
            settings.store.db_max_connections = 4;
        }
    }
    Some(settings)
}

impl TestApp {
    /// Spawns an app with the default test settings.
    pub async fn spawn(backend: Backend) -> Option<TestApp> {
        Self::spawn_with(backend, |_| {}).await
    }

    /// Spawns a production app (Postgres) whose hot store is a new local 3-master Redis
    /// Cluster; None (a skip) where either is missing. Keep the cluster until the test ends.
    pub async fn on_cluster() -> Option<(RedisCluster, TestApp)> {
        let cluster = RedisCluster::start().await?;
        let app = Self::spawn_with(Backend::Production, |settings| {
            settings.redis_url = Some(cluster.url.clone())
        })
        .await?;
        Some((cluster, app))
    }

    /// Spawns an app after `adjust` has changed its settings.
    pub async fn spawn_with(
        backend: Backend,
        adjust: impl FnOnce(&mut Settings),
    ) -> Option<TestApp> {
        init_test_logging();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut settings = test_settings(backend, &dir).await?;
        adjust(&mut settings);
        Some(Self::start(backend, settings, Arc::new(dir)).await)
    }

    /// Starts another instance on the same stores (scale-out tests).
    pub async fn another_instance(&self) -> TestApp {
        Self::start(self.backend, self.settings.clone(), self._dir.clone()).await
    }

    /// Starts another instance with these settings changed (another region: its own hot
    /// store, the same database).
    pub async fn another_instance_with(&self, adjust: impl FnOnce(&mut Settings)) -> TestApp {
        let mut settings = self.settings.clone();
        adjust(&mut settings);
        Self::start(self.backend, settings, self._dir.clone()).await
    }

    /// Starts another instance on the same stores whose wall clock reads `wall_ms`.
    pub async fn another_instance_with_wall_clock(&self, wall_ms: i64) -> TestApp {
        let clock = ManualClock::new(wall_ms);
        Self::start_with_clock(
            self.backend,
            self.settings.clone(),
            self._dir.clone(),
            Some(clock),
        )
        .await
    }

    /// Lets time pass: the manual clock (embedded) or real time (production).
    pub async fn advance(&self, by: std::time::Duration) {
        match &self.clock {
            Some(clock) => clock.advance(by),
            None => tokio::time::sleep(by).await,
        }
    }

    async fn start(backend: Backend, settings: Settings, dir: Arc<tempfile::TempDir>) -> TestApp {
        let clock = (backend == Backend::Embedded).then(|| ManualClock::new(1_800_000_000_000));
        Self::start_with_clock(backend, settings, dir, clock).await
    }

    async fn start_with_clock(
        backend: Backend,
        settings: Settings,
        dir: Arc<tempfile::TempDir>,
        clock: Option<ManualClock>,
    ) -> TestApp {
        let settings = settings.validate().expect("test settings are valid");
        let app_clock: Arc<dyn Clock> = match &clock {
            Some(manual) => Arc::new(manual.clone()),
            None => Arc::new(SystemClock::new()),
        };
        let app = App::build_with_clock(settings.clone(), app_clock)
            .await
            .expect("app builds")
            .into_state();
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let serving = app.clone();
        tokio::spawn(async move {
            palisade::serve(serving, listener, async {
                let _ = rx.await;
            })
            .await
            .expect("serve");
        });
        TestApp {
            base,
            client: reqwest::Client::new(),
            backend,
            settings,
            app,
            clock,
            shutdown: Some(tx),
            _dir: dir,
        }
    }

    /// Full URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request with an optional bearer token and JSON body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> reqwest::Response {
        let mut request = self.client.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.expect("request sent")
    }

    /// `GET path` with a token.
    pub async fn get(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        self.request(Method::GET, path, token, None).await
    }

    /// `GET path` with the admin token: the 200 answer's JSON.
    pub async fn admin_json(&self, path: &str) -> Value {
        let response = self.get(path, Some(ADMIN_TOKEN)).await;
        assert_eq!(response.status(), reqwest::StatusCode::OK, "GET {path}");
        response.json().await.expect("a JSON answer")
    }

    /// `POST path` with a token and a JSON body.
    pub async fn post(&self, path: &str, token: Option<&str>, body: &Value) -> reqwest::Response {
        self.request(Method::POST, path, token, Some(body)).await
    }

    /// `POST /v1/limit/check` with the admin token.
    pub async fn limit_check(&self, body: &Value) -> reqwest::Response {
        self.post("/v1/limit/check", Some(ADMIN_TOKEN), body).await
    }

    /// `POST /v1/admin/tokens` as admin; returns `(id, token)`.
    pub async fn create_token(&self, role: &str, name: &str) -> (String, String) {
        let response = self
            .post(
                "/v1/admin/tokens",
                Some(ADMIN_TOKEN),
                &serde_json::json!({ "role": role, "name": name, "reason": "test" }),
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "create token {name}"
        );
        let body: Value = response.json().await.expect("json");
        (
            body["id"].as_str().expect("id").to_owned(),
            body["token"].as_str().expect("token").to_owned(),
        )
    }
}

/// Asserts status and envelope code, that the envelope's request id matches the
/// `X-Request-Id` header; returns the body.
#[track_caller]
pub fn assert_envelope_parts(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    expected: StatusCode,
    code: &str,
) {
    assert_eq!(status, expected, "status; body {body}");
    assert_eq!(body["error"]["code"], code, "code; body {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "message; body {body}"
    );
    let header_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("X-Request-Id header");
    assert_eq!(
        body["error"]["request_id"], header_id,
        "request id; body {body}"
    );
}

/// Reads a response and asserts it is the envelope with `code`; returns the body.
pub async fn assert_envelope(
    response: reqwest::Response,
    expected: StatusCode,
    code: &str,
) -> Value {
    let status = response.status();
    let headers = response.headers().clone();
    let body: Value = response.json().await.expect("envelope is JSON");
    assert_envelope_parts(status, &headers, &body, expected, code);
    body
}

/// Copies `files` (`(path in the repository, path in dir)`) into `dir`; a `*.gz` source
/// copied to a name without `.gz` is decompressed on the way.
pub fn lay_out(dir: &std::path::Path, files: &[(&str, &str)]) {
    for (from, to) in files {
        let target = dir.join(to);
        std::fs::create_dir_all(target.parent().expect("a file path")).expect("create folder");
        let source = repo_file(from);
        if from.ends_with(".gz") && !to.ends_with(".gz") {
            let mut decoder =
                flate2::read::GzDecoder::new(std::fs::File::open(&source).expect("open fixture"));
            let mut out = std::fs::File::create(&target).expect("create target");
            std::io::copy(&mut decoder, &mut out).unwrap_or_else(|e| panic!("gunzip {from}: {e}"));
        } else {
            std::fs::copy(&source, &target).unwrap_or_else(|e| panic!("copy {from}: {e}"));
        }
    }
}

impl TestApp {
    /// Lays repository data files out in this app's data dir and reloads it.
    pub async fn load_data(&self, files: &[(&str, &str)]) {
        lay_out(&self.settings.data_dir, files);
        let reloaded = self
            .post(
                "/v1/admin/reload",
                Some(ADMIN_TOKEN),
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(reloaded.status(), StatusCode::OK);
    }
}

/// The value of one series (its name and labels exactly as exported, e.g.
/// `palisade_forward_auth_total{outcome="pass"}`) in a `/metrics` text; 0 when it is absent.
/// The registry is the process's, so other tests may have added to a counter.
pub fn metric_value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A file of the repository (the shipped lists in `data/`, fixtures in `tests/fixtures/`).
pub fn repo_file(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn init_test_logging() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if std::env::var("TEST_LOG").is_ok() {
            palisade::telemetry::init(palisade::config::LogFormat::Text);
        }
    });
}

/// A partner's budget: `limit` reads an hour per tenant (`scope = "tenant"`, class `read`).
pub fn partner_budget(limit: u32) -> palisade::config::BudgetSettings {
    palisade::config::BudgetSettings {
        name: "partner".to_owned(),
        scope: palisade::config::ScopeKind::Tenant,
        classes: vec!["read".to_owned()],
        limit,
        period_s: 3600,
        burst: None,
        when: palisade::config::When::Always,
        shadow: false,
    }
}

/// Checks a signed identity printed by a tool against `secret` at the wall clock's now.
pub fn verify_identity_now(secret: &str, text: &str) -> palisade::access::identity::Identity {
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    palisade::access::identity::verify(
        &[palisade::config::Secret::new(secret)],
        Some(text.trim()),
        now_s,
    )
    .unwrap_or_else(|err| panic!("{err}: {text}"))
}

/// The `palisade` binary with no `PALISADE_*` variable of the host: the test runner's own
/// `PALISADE_TEST_*` are skipped by the loader, anything else could change the outcome.
pub fn palisade_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
    for (key, _) in std::env::vars() {
        if key.starts_with("PALISADE_") {
            command.env_remove(key);
        }
    }
    command
}
