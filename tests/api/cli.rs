//! The `palisade` binary: settings errors, `migrate`, `token create`.

use std::process::Command;

fn palisade() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_palisade"));
    // The test runner's own PALISADE_TEST_* variables are skipped by the loader; clear
    // anything else so the host environment cannot change the outcome.
    for (key, _) in std::env::vars() {
        if key.starts_with("PALISADE_") {
            command.env_remove(key);
        }
    }
    command
}

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
    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", &db)
        .args(["token", "create", "--role", "analyst", "--name", "alice"])
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
    let output = palisade()
        .current_dir(dir.path())
        .env("PALISADE_DATABASE_URL", &db)
        .args(["token", "create", "--role", "root", "--name", "x"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "clap rejects an unknown role"
    );
}
