//! The real `crowdsec-custom-bouncer` (Debian's package) against Palisade's LAPI endpoints:
//! it pulls the stream with its own filters and runs its script for each ban.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp};

/// The bouncer binary, or None (a loud skip locally; a failure in CI).
fn custom_bouncer() -> Option<PathBuf> {
    let path = PathBuf::from("/usr/bin/crowdsec-custom-bouncer");
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "CI=true but crowdsec-custom-bouncer is not installed (.ci/run installs it)"
    );
    eprintln!("SKIPPED (no crowdsec-custom-bouncer): apt-get install crowdsec-custom-bouncer");
    None
}

/// The bouncer process, stopped by PID on drop.
struct Bouncer(Child);

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crowdsec_custom_bouncer_applies_palisade_bans_with_its_filters() {
    let Some(binary) = custom_bouncer() else {
        return;
    };
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let (_, key) = app.create_token("limiter", "custom-bouncer").await;
    for (value, reason) in [
        ("203.0.113.7", "credential stuffing"),
        ("198.51.100.0/24", "abusive hosting range"),
        ("192.0.2.99", "skipme test entry"),
    ] {
        let response = app
            .post(
                "/v1/lists/deny",
                Some(ADMIN_TOKEN),
                &json!({"kind": "cidr", "value": value, "reason": reason}),
            )
            .await;
        assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    }
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.txt");
    let script = dir.path().join("apply.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$1 $2\" >> {}\n", seen.display()),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = dir.path().join("bouncer.yaml");
    std::fs::write(
        &config,
        format!(
            "bin_path: {script}\nfeed_via_stdin: false\ntotal_retries: 0\n\
             scenarios_containing: []\nscenarios_not_containing: [skipme]\norigins: []\n\
             piddir: {dir}\nupdate_frequency: 1s\ncache_retention_duration: 10s\n\
             daemonize: false\nlog_mode: stdout\nlog_level: info\n\
             api_url: {base}/crowdsec/\napi_key: {key}\nprometheus:\n  enabled: false\n",
            script = script.display(),
            dir = dir.path().display(),
            base = app.base,
        ),
    )
    .unwrap();
    let _bouncer = Bouncer(
        Command::new(binary)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = String::new();
    while Instant::now() < deadline {
        lines = std::fs::read_to_string(&seen).unwrap_or_default();
        if lines.contains("203.0.113.7") && lines.contains("198.51.100.0/24") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(lines.contains("add 203.0.113.7"), "{lines}");
    assert!(
        lines.contains("add 198.51.100.0/24"),
        "a range stays a range: {lines}"
    );
    assert!(
        !lines.contains("192.0.2.99"),
        "filtered out by its scenario: {lines}"
    );
}

/// The real `crowdsec-firewall-bouncer` (Debian's package, ipset mode) pulls Palisade's
/// stream and puts each ban into the kernel's firewall: one address, and a /24 as a range
/// (a `hash:net` set). Its set and chain are the test's own (`paltest…`, a chain no
/// traffic passes through), removed afterwards; the banned addresses are documentation
/// ranges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crowdsec_firewall_bouncer_puts_palisade_bans_into_the_firewall() {
    let binary = PathBuf::from("/usr/bin/crowdsec-firewall-bouncer");
    let id = std::process::id();
    let (set, chain) = (format!("paltest{id}"), format!("PALTEST{id}"));
    let firewall_works = binary.is_file()
        && Command::new("iptables")
            .args(["-N", &chain])
            .output()
            .is_ok_and(|o| o.status.success())
        && Command::new("ipset")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !firewall_works {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but crowdsec-firewall-bouncer, iptables or ipset is missing (.ci/run installs them)"
        );
        eprintln!(
            "SKIPPED (no firewall bouncer or no firewall rights): apt-get install crowdsec-firewall-bouncer iptables ipset"
        );
        return;
    }
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let (_, key) = app.create_token("limiter", "firewall-bouncer").await;
    for (value, reason) in [
        ("203.0.113.8", "credential stuffing"),
        ("198.51.100.0/24", "abusive hosting range"),
    ] {
        let response = app
            .post(
                "/v1/lists/deny",
                Some(ADMIN_TOKEN),
                &json!({"kind": "cidr", "value": value, "reason": reason}),
            )
            .await;
        assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("firewall.yaml");
    std::fs::write(
        &config,
        format!(
            "mode: iptables\npid_dir: {dir}\nupdate_frequency: 1s\ndaemonize: false\n\
             log_mode: stdout\nlog_level: info\napi_url: {base}/crowdsec/\napi_key: {key}\n\
             disable_ipv6: true\ndeny_action: DROP\ndeny_log: false\n\
             supported_decisions_types:\n  - ban\n\
             blacklists_ipv4: {set}\nblacklists_ipv6: {set}v6\nipset_type: nethash\n\
             iptables_chains:\n  - {chain}\nprometheus:\n  enabled: false\n",
            dir = dir.path().display(),
            base = app.base,
        ),
    )
    .unwrap();
    let log = dir.path().join("bouncer.log");
    let child = Command::new(&binary)
        .arg("-c")
        .arg(&config)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    /// Stopped with TERM (it removes its rule and set), then the chain and set removed
    /// whatever happened.
    struct Firewall(Child, String, String);
    impl Drop for Firewall {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && self.0.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
            for args in [
                vec!["iptables", "-F", &self.2],
                vec!["iptables", "-X", &self.2],
                vec!["ipset", "destroy", &self.1],
            ] {
                let _ = Command::new(args[0])
                    .args(&args[1..])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    let _firewall = Firewall(child, set.clone(), chain.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut members = String::new();
    while Instant::now() < deadline {
        let output = Command::new("ipset").args(["list", &set]).output().unwrap();
        members = String::from_utf8_lossy(&output.stdout).into_owned();
        if members.contains("203.0.113.8") && members.contains("198.51.100.0/24") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        members.contains("203.0.113.8") && members.contains("198.51.100.0/24"),
        "ipset {set}:\n{members}\nbouncer log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let rules = Command::new("iptables")
        .args(["-S", &chain])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(
        rules.contains(&format!("--match-set {set} src -j DROP")),
        "the chain drops the set: {rules}"
    );
}
