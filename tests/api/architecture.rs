//! ARCHITECTURE.md's invariants, checked on the source tree: each names what may appear only
//! in some rooms, and the test lists every file outside them where it does. A file's own
//! test module (`#[cfg(test)] mod …`, at its end by the house style) is not searched.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `src/`, as (path relative to `src/`, text before its test module).
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    let sources: Vec<(String, String)> = files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let body = match text.find("#[cfg(test)]\nmod ") {
                Some(at) => text[..at].to_owned(),
                None => text,
            };
            let relative = path.strip_prefix(&root).unwrap().to_string_lossy();
            (relative.replace('\\', "/"), body)
        })
        .collect();
    assert!(sources.len() > 100, "{} source files", sources.len());
    sources
}

/// The files, outside the rooms `allowed` (paths or folder prefixes relative to `src/`),
/// that contain any of `needles`, each with the first it contains.
fn offenders(allowed: &[&str], needles: &[&str]) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|(path, _)| !allowed.iter().any(|room| path.starts_with(room)))
        .filter_map(|(path, text)| {
            needles
                .iter()
                .find(|needle| text.contains(*needle))
                .map(|needle| format!("{path}: {needle}"))
        })
        .collect()
}

#[test]
fn only_the_http_edge_speaks_http() {
    let found = offenders(
        &["api/"],
        &["axum::", "tonic::", "tower::", "tower_http::", "hyper::"],
    );
    assert!(found.is_empty(), "domains never see HTTP: {found:#?}");
}

#[test]
fn only_config_reads_the_environment() {
    let found = offenders(&["config/"], &["env::var(", "env::vars(", "env::var_os("]);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn only_store_and_the_wiring_see_the_store_urls() {
    // The command-line tools and the login replay build instances of their own, as `app`
    // does.
    let found = offenders(
        &["config/", "store/", "cli/", "app.rs", "login_replay.rs"],
        &["database_url", "redis_url"],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn only_store_keys_builds_redis_keys() {
    // The key prefix (`Keys::prefix`), and a hash tag written into a format string, are the
    // two ways a key could be spelled outside `store::keys`.
    let found = offenders(&["store/"], &["keys.prefix()", "keys().prefix()", ":{{"]);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn time_and_ids_come_from_the_clock() {
    // Request ids are made at the edge, and the command-line tools date what they read for
    // an operator; no room reads the wall clock or makes an id.
    let found = offenders(
        &["clock.rs", "api/", "cli/"],
        &["Utc::now", "SystemTime::now", "Local::now", "Ulid::new("],
    );
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn keyset_pages_compare_rows() {
    // `a > $1 OR (a = $1 AND b > $2)` is a filter Postgres applies to every row from the
    // index's start, so each page of a walk costs all the pages before it; `(a, b) > ($1,
    // $2)` is an index condition that starts at the cursor (both engines read it).
    let spelled = regex::Regex::new(r"> \$\d+ OR \(\s*\w+ = \$\d+").unwrap();
    let found: Vec<String> = sources()
        .into_iter()
        .filter(|(_, text)| spelled.is_match(text))
        .map(|(path, _)| path)
        .collect();
    assert!(found.is_empty(), "{found:#?}");
}
