//! The `palisade` binary: settings errors, `migrate`, `issue-token`, `health`.

use crate::helpers::palisade_command as palisade;

#[test]
fn a_wrong_setting_stops_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_LISTEN", "abc")
        .arg("serve")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("palisade: PALISADE_LISTEN"), "{stderr}");

    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_LOG_FORMAT", "xml")
        .arg("serve")
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("PALISADE_LOG_FORMAT") && stderr.contains("json"),
        "{stderr}"
    );
}

#[test]
fn migrate_and_token_create_work_on_a_fresh_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("p.db").display());
    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", &db)
        .arg("migrate")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The database holds accounts, addresses and token hashes: its owner's only.
    {
        use std::os::unix::fs::PermissionsExt;
        for file in ["p.db", "p.db-wal", "p.db-shm"] {
            let path = dir.path().join(file);
            if let Ok(meta) = std::fs::metadata(&path) {
                assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{file}");
            }
        }
    }
    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", &db)
        .args(["issue-token", "--role", "analyst", "--name", "alice"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.lines().any(|l| l.starts_with("token: pal_")),
        "{stdout}"
    );
    // It says which database it wrote to, as an absolute path.
    assert!(
        stdout
            .lines()
            .any(|l| l == format!("store: sqlite://{}", dir.path().join("p.db").display())),
        "{stdout}"
    );
    let relative = palisade()
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", "sqlite://q.db")
        .args(["issue-token", "--role", "analyst", "--name", "bob"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(relative.stdout).unwrap();
    assert!(
        stdout
            .lines()
            .any(|l| l == format!("store: sqlite://{}", dir.path().join("q.db").display())),
        "{stdout}"
    );
    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", &db)
        .args(["issue-token", "--role", "root", "--name", "x"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "clap rejects an unknown role"
    );
}

/// `palisade ranges update` downloads configured sources atomically; a broken or missing
/// download keeps the previous file and fails the command naming the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_update_downloads_sources_and_keeps_old_files_on_error() {
    let server = axum::Router::new()
        .route(
            "/good.txt",
            axum::routing::get(|| async { "# test\n10.0.0.0/8\n192.0.2.1\n" }),
        )
        .route(
            "/bad.txt",
            axum::routing::get(|| async { "10.0.0.0/8\nnot an ip\n" }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, server).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("ranges/vpn")).unwrap();
    std::fs::write(data.join("ranges/vpn/bad.txt"), "198.51.100.0/24\n").unwrap();
    let config = dir.path().join("palisade.toml");
    std::fs::write(
        &config,
        format!(
            "[[reputation.sources]]\nname = \"good.txt\"\nclass = \"datacenter\"\nurl = \"{base}/good.txt\"\n\n\
             [[reputation.sources]]\nname = \"bad.txt\"\nclass = \"vpn\"\nurl = \"{base}/bad.txt\"\n\n\
             [[reputation.sources]]\nname = \"gone.txt\"\nclass = \"tor\"\nurl = \"{base}/gone.txt\"\n"
        ),
    )
    .unwrap();
    let child_data = data.clone();
    // The temp dir moves into the blocking task and back, so it outlives the command.
    let (output, _dir) = tokio::task::spawn_blocking(move || {
        let output = palisade()
            .current_dir(dir.path())
            .env("PALISADE_DATA_DIR", &child_data)
            .args(["--config", config.to_str().unwrap(), "ranges", "update"])
            .output()
            .unwrap();
        (output, dir)
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stdout.contains("updated ranges/datacenter/good.txt: 2 ranges"),
        "{stdout}"
    );
    assert!(
        stderr.contains("ranges/vpn/bad.txt not updated") && stderr.contains("line 2"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ranges/tor/gone.txt not updated") && stderr.contains("404"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("ranges/datacenter/good.txt")).unwrap(),
        "# test\n10.0.0.0/8\n192.0.2.1\n"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("ranges/vpn/bad.txt")).unwrap(),
        "198.51.100.0/24\n",
        "old file kept"
    );
    assert!(!data.join("ranges/tor/gone.txt").exists());
}

/// A download that stops sending is given up after the idle timeout (naming the source),
/// and the previous file stays; a slow one that keeps moving is not cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_update_gives_up_on_a_stalled_download_only() {
    use futures_util::StreamExt;
    let trickle = |pause_ms: u64, parts: usize| {
        let stream = futures_util::stream::iter(0..parts).then(move |i| async move {
            if i > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
            }
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from(format!("10.{i}.0.0/16\n")))
        });
        axum::body::Body::from_stream(stream)
    };
    let server = axum::Router::new()
        // Five parts 600 ms apart: 2.4 s in all, never 1 s without data.
        .route(
            "/slow.txt",
            axum::routing::get(move || async move { trickle(600, 5) }),
        )
        // One part, then nothing for 30 s.
        .route(
            "/stall.txt",
            axum::routing::get(move || async move { trickle(30_000, 2) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, server).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("ranges/vpn")).unwrap();
    std::fs::write(data.join("ranges/vpn/stall.txt"), "198.51.100.0/24\n").unwrap();
    let config = dir.path().join("palisade.toml");
    std::fs::write(
        &config,
        format!(
            "[[reputation.sources]]\nname = \"slow.txt\"\nclass = \"datacenter\"\nurl = \"{base}/slow.txt\"\n\n\
             [[reputation.sources]]\nname = \"stall.txt\"\nclass = \"vpn\"\nurl = \"{base}/stall.txt\"\n"
        ),
    )
    .unwrap();
    let child_data = data.clone();
    let started = std::time::Instant::now();
    let (output, _dir) = tokio::task::spawn_blocking(move || {
        let output = palisade()
            .current_dir(dir.path())
            .env("PALISADE_DATA_DIR", &child_data)
            .args([
                "--config",
                config.to_str().unwrap(),
                "ranges",
                "update",
                "--idle-timeout",
                "1",
            ])
            .output()
            .unwrap();
        (output, dir)
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("updated ranges/datacenter/slow.txt: 5 ranges"),
        "{stdout}{stderr}"
    );
    assert!(
        stderr.contains("ranges/vpn/stall.txt not updated") && stderr.contains("no data for 1 s"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the stall was cut"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("ranges/vpn/stall.txt")).unwrap(),
        "198.51.100.0/24\n",
        "old file kept"
    );
}

/// `palisade health` is the container's health check: 0 for a ready instance, 1 otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_asks_readyz_of_a_running_instance() {
    let app = crate::helpers::TestApp::spawn(crate::helpers::Backend::Embedded)
        .await
        .unwrap();
    let base = app.base.clone();
    let ok = tokio::task::spawn_blocking(move || {
        palisade()
            .args(["health", "--url", &base])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("ready"));
    let port = crate::helpers::free_port();
    let down = tokio::task::spawn_blocking(move || {
        palisade()
            .args(["health", "--url", &format!("http://127.0.0.1:{port}")])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(down.status.code(), Some(1));
}

/// `palisade identity sign` prints an identity the service accepts (v2 with `--tid`); a short
/// secret is refused.
#[test]
fn identity_sign_prints_a_valid_identity_and_short_secrets_are_refused() {
    let secret = "cli-identity-secret-0123456789abcdef";
    let output = palisade()
        .env("PALISADE_FORWARD_AUTH__IDENTITY_SECRET", secret)
        .args([
            "identity", "sign", "--uid", "alice", "--did", "phone-1", "--ttl", "60",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    let identity = crate::helpers::verify_identity_now(secret, &text);
    assert_eq!(identity.user.as_deref(), Some("alice"));
    assert_eq!(identity.device.as_deref(), Some("phone-1"));
    assert_eq!(identity.tenant, None);
    let output = palisade()
        .env("PALISADE_FORWARD_AUTH__IDENTITY_SECRET", secret)
        .args(["identity", "sign", "--uid", "alice", "--tid", "acme"])
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let identity = crate::helpers::verify_identity_now(secret, &text);
    assert_eq!(identity.tenant.as_deref(), Some("acme"), "{text}");
    let output = palisade()
        .env("PALISADE_FORWARD_AUTH__IDENTITY_SECRET", "short")
        .args(["identity", "sign", "--uid", "alice"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("IDENTITY_SECRET"));
}

/// `palisade lockouts|lists|overrides|tokens` against a running instance: tables for people, `--json`
/// for scripts, the API's error on a bad token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_commands_list_and_change_lockouts_lists_and_tokens() {
    use crate::helpers::ADMIN_TOKEN;
    let app = crate::helpers::TestApp::spawn(crate::helpers::Backend::Embedded)
        .await
        .unwrap();
    let events: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            serde_json::json!({"event_id": format!("cli-{i}"), "type": "login_failure",
                               "account": "carol", "ip": "203.0.113.5"})
        })
        .collect();
    app.post_auth(events).await;
    let base = app.base.clone();
    let run = move |args: Vec<String>, token: &'static str| {
        let base = base.clone();
        tokio::task::spawn_blocking(move || {
            let output = palisade()
                .args(&args)
                .args(["--url", &base, "--token", token])
                .output()
                .unwrap();
            (
                output.status.code(),
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            )
        })
    };
    let args = |text: &str| text.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let (code, out, err) = run(args("lockouts list"), ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("ID") && out.contains("carol"), "{out}");
    let (_, out, _) = run(args("lockouts list --json"), ADMIN_TOKEN)
        .await
        .unwrap();
    let page: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = page["items"][0]["id"].as_str().unwrap().to_owned();
    let mut release = args("lockouts release");
    release.extend([
        id.clone(),
        "--reason".to_owned(),
        "verified by phone".to_owned(),
    ]);
    let (code, out, err) = run(release, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&id), "{out}");
    let mut add = args("lists add deny 198.51.100.0/24");
    add.extend(["--reason".to_owned(), "abusive hosting".to_owned()]);
    let (code, out, err) = run(add, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("198.51.100.0/24"), "{out}");
    let (_, out, _) = run(args("lists list deny --json"), ADMIN_TOKEN)
        .await
        .unwrap();
    let entries: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = entries["items"][0]["id"].as_str().unwrap().to_owned();
    let mut remove = args("lists remove deny");
    remove.extend([entry, "--reason".to_owned(), "lifted".to_owned()]);
    let (code, _, err) = run(remove, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = run(args("lists list deny"), ADMIN_TOKEN).await.unwrap();
    assert!(!out.contains("198.51.100.0/24"), "{out}");
    let until = chrono::DateTime::from_timestamp_millis(app.app.clock.now_ms() + 3_600_000)
        .unwrap()
        .to_rfc3339();
    let mut set = args("overrides set user:partner --multiplier 3 --classes read,write");
    set.extend([
        "--expires-at".to_owned(),
        until,
        "--reason".to_owned(),
        "launch day".to_owned(),
    ]);
    let (code, out, err) = run(set, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("user:partner"), "{out}");
    let (_, out, _) = run(args("overrides list --json"), ADMIN_TOKEN)
        .await
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        listed["items"][0]["classes"],
        serde_json::json!(["read", "write"])
    );
    let override_id = listed["items"][0]["id"].as_str().unwrap().to_owned();
    let mut remove = args("overrides remove");
    remove.extend([override_id, "--reason".to_owned(), "launch over".to_owned()]);
    let (code, _, err) = run(remove, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = run(args("overrides list"), ADMIN_TOKEN).await.unwrap();
    assert!(!out.contains("user:partner"), "{out}");
    let file = std::env::temp_dir().join(format!("palisade-export-{}.json", std::process::id()));
    let mut export = args("export cloudflare --out");
    export.push(file.display().to_string());
    let (code, _, err) = run(export, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    let exported: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(
        exported["rate_limiting_rules"]["rules"].is_array(),
        "{exported}"
    );
    let (code, out, _) = run(args("export fastly"), ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0));
    assert!(out.contains("acl palisade_deny"), "{out}");
    let mut create = args("tokens create edge-gateway --role limiter --reason");
    create.push("a new gateway".to_owned());
    let (code, out, err) = run(create, ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("edge-gateway") && out.contains("pal_"),
        "{out}"
    );
    let (code, out, _) = run(args("tokens list"), ADMIN_TOKEN).await.unwrap();
    assert_eq!(code, Some(0));
    assert!(out.starts_with("ID"), "{out}");
    assert!(out.contains("edge-gateway"), "{out}");
    let (code, _, err) = run(args("lockouts list"), "pal_not-a-token").await.unwrap();
    assert_eq!(code, Some(1));
    assert!(
        err.contains("401") && err.contains("UNAUTHENTICATED"),
        "{err}"
    );
}

/// `PALISADE_URL` and `PALISADE_TOKEN`, as the README and `--help` name them, work in place
/// of `--url` and `--token` for every remote command (they are the command line's own
/// variables, not service settings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_commands_take_the_url_and_token_from_the_environment() {
    let app = crate::helpers::TestApp::spawn(crate::helpers::Backend::Embedded)
        .await
        .unwrap();
    let base = app.base.clone();
    for command in [
        "lockouts list",
        "lists list deny",
        "tokens list",
        "overrides list",
        "export cloudflare",
    ] {
        let base = base.clone();
        let output = tokio::task::spawn_blocking(move || {
            palisade()
                .args(command.split(' '))
                .env("PALISADE_URL", &base)
                .env("PALISADE_TOKEN", crate::helpers::ADMIN_TOKEN)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{command}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Started outside its checkout (no `./data`), the binary finds the shipped range lists and
/// says where they came from; it never starts silently with empty reputation classes.
#[test]
fn started_elsewhere_it_finds_the_shipped_data_and_says_where() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = palisade()
        .current_dir(dir.path())
        .env("PALISADE_LISTEN", "127.0.0.1:0")
        .env("PALISADE_GRPC_LISTEN", "127.0.0.1:0")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let found = loop {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(line) => {
                if line.contains("reputation data from the shipped folder") {
                    break Some(line);
                }
                seen.push(line);
            }
            Err(_) if std::time::Instant::now() > deadline => break None,
            Err(_) => {}
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let line = found.unwrap_or_else(|| panic!("no word on the data folder: {seen:#?}"));
    assert!(line.contains("/data"), "{line}");
    assert!(
        !seen
            .iter()
            .any(|l| l.contains("reputation class tor is empty")),
        "{seen:#?}"
    );
}
