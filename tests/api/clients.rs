//! The mobile client snippets in `docs/clients/` build and pass their own tests with the
//! real toolchain (Kotlin: Debian's kotlinc, OkHttp 3 and JUnit 4; Debian has no Swift), and
//! their backoff schedule is the Rust client's, case by case.

use std::path::Path;
use std::process::Command;

use crate::helpers::repo_file;

const JARS: &[&str] = &[
    "/usr/share/java/okhttp.jar",
    "/usr/share/java/okio.jar",
    "/usr/share/java/junit4.jar",
    "/usr/share/java/hamcrest-core.jar",
];
const STDLIB: &str = "/usr/share/java/kotlin-stdlib.jar";

/// `kotlinc` and the jars, or false (a loud skip locally; a failure in CI).
fn kotlin_toolchain() -> bool {
    let present = Command::new("kotlinc").arg("-version").output().is_ok()
        && JARS
            .iter()
            .chain([&STDLIB])
            .all(|jar| Path::new(jar).is_file());
    if !present {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but kotlin, libokhttp-java or junit4 is missing (.ci/run installs them)"
        );
        eprintln!("SKIPPED (no Kotlin toolchain): apt-get install kotlin libokhttp-java junit4");
    }
    present
}

#[test]
fn the_kotlin_client_builds_and_backs_off_as_the_rust_client_does() {
    if !kotlin_toolchain() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The Rust client's waits (ms) for attempts 0–12 at 200 seeded draws each, and the ends.
    let policy = palisade::client::RetryPolicy::default();
    let mut cases = String::new();
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261205);
    for attempt in 0..=12u32 {
        let mut units = vec![0.0, 0.999_999];
        units.extend((0..200).map(|_| rng.random::<f64>()));
        for unit in units {
            let wait = policy.full_jitter(attempt, unit).as_millis();
            cases.push_str(&format!("{attempt} {unit:?} {wait}\n"));
        }
    }
    let cases_file = dir.path().join("cases.txt");
    std::fs::write(&cases_file, cases).unwrap();
    let classes = dir.path().join("classes");
    let classpath = JARS.join(":");
    let compiled = Command::new("kotlinc")
        .arg(repo_file("docs/clients/kotlin/Palisade.kt"))
        .arg(repo_file("docs/clients/kotlin/PalisadeTest.kt"))
        .args(["-cp", &classpath, "-d"])
        .arg(&classes)
        .output()
        .unwrap();
    assert!(
        compiled.status.success(),
        "kotlinc: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new("java")
        .arg(format!("-Dpalisade.backoff.cases={}", cases_file.display()))
        .arg("-cp")
        .arg(format!("{}:{STDLIB}:{classpath}", classes.display()))
        .args(["org.junit.runner.JUnitCore", "palisade.client.PalisadeTest"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(out.contains("OK (7 tests)"), "{out}");
}
