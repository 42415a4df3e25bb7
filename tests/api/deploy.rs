//! Deployment files: the systemd unit verifies, the container image checks its own health and
//! keeps the build context small, the compose file checks every service.

use std::process::Command;

use crate::helpers::repo_file;

/// `systemd-analyze verify` of `deploy/systemd/palisade.service`, pointed at the built binary.
#[test]
fn the_systemd_unit_verifies() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true but systemd-analyze is missing (.ci/run installs it)"
        );
        eprintln!("SKIPPED: systemd-analyze is not installed");
        return;
    };
    assert!(version.status.success());
    let unit = std::fs::read_to_string(repo_file("deploy/systemd/palisade.service")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/palisade", env!("CARGO_BIN_EXE_palisade")),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // Unknown keys are only warnings to systemd: none is allowed here.
    assert!(
        !stderr.contains("palisade.service"),
        "systemd-analyze warns: {stderr}"
    );
    assert!(unit.contains("UMask=0077"));
}

#[test]
fn the_image_checks_its_health_and_listens_for_grpc_everywhere() {
    let dockerfile = std::fs::read_to_string(repo_file("Dockerfile")).unwrap();
    assert!(dockerfile.contains("HEALTHCHECK"), "{dockerfile}");
    assert!(dockerfile.contains(r#"CMD ["palisade", "health"]"#));
    assert!(dockerfile.contains("PALISADE_GRPC_LISTEN=0.0.0.0:8081"));
    assert!(dockerfile.contains("USER palisade"));
    let ignored = std::fs::read_to_string(repo_file(".dockerignore")).unwrap();
    assert!(ignored.lines().any(|l| l.trim() == "target/"), "{ignored}");
    let compose = std::fs::read_to_string(repo_file("docker-compose.yml")).unwrap();
    // Every service (two-space indented names under `services:`) has a healthcheck.
    let services = compose
        .split("\nservices:\n")
        .nth(1)
        .unwrap()
        .split("\nnetworks:")
        .next()
        .unwrap();
    let names: Vec<&str> = services
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   ") && l.ends_with(':'))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(
        services.matches("    healthcheck:").count(),
        3,
        "{services}"
    );
    assert!(compose.contains("PALISADE_TRUSTED_PROXIES"));
}
