//! Every spelling of one route is one canonical target: escapes, case, parameters, suffixes and
//! bytes outside ASCII, as gateways forward them.

use super::*;

fn path(target: &str) -> String {
    canonical(target, true).unwrap().path.into_owned()
}

#[test]
fn spellings_of_login_are_login() {
    for spelling in [
        "/login",
        "/Login",
        "/LOGIN",
        "/login/",
        "//login",
        "/%6cogin",
        "/%6Cogin",
        "/login;jsessionid=1",
        "/./login",
        "/static/../login",
        "/static/..;/login",
        "/a/b/../../login",
        "/../login",
        "/login?next=/",
        "/login#frag",
        "/%2e/login",
        "/%2E%2E/login",
    ] {
        assert_eq!(path(spelling), "/login", "{spelling}");
    }
    assert_eq!(path("/oauth/token/"), "/oauth/token");
    assert_eq!(path("/auth//login"), "/auth/login");
    assert_eq!(path("/"), "/");
    assert_eq!(path("//"), "/");
    assert_eq!(path("/.."), "/");
}

#[test]
fn other_escapes_keep_their_bytes_in_one_case() {
    assert_eq!(path("/a%20b"), "/a%20b");
    assert_eq!(
        canonical("/a%c3%a9", false).unwrap().path,
        "/a%C3%A9",
        "hex is upper case"
    );
    assert!(!canonical("/a%20b", true).unwrap().is_ambiguous());
}

#[test]
fn case_is_kept_when_matching_is_case_sensitive() {
    assert_eq!(canonical("/Login/", false).unwrap().path, "/Login");
}

#[test]
fn ambiguous_spellings_carry_the_most_decoded_reading() {
    let cases = [
        ("/auth%2flogin", "/auth%2Flogin", "/auth/login"),
        ("/auth%5Clogin", "/auth%5Clogin", "/auth/login"),
        ("/auth\\login", "/auth%5Clogin", "/auth/login"),
        ("/%256cogin", "/%256cogin", "/login"),
        ("/log%zzin", "/log%25zzin", "/log%zzin"),
        ("/login%", "/login%25", "/login%"),
    ];
    for (spelling, canonical_path, decoded) in cases {
        let target = canonical(spelling, true).unwrap();
        assert_eq!(
            target.path,
            canonical_path.to_ascii_lowercase(),
            "{spelling}"
        );
        assert_eq!(target.decoded, [decoded], "{spelling}");
    }
}

#[test]
fn parameters_dropped_before_or_after_decoding_give_two_readings() {
    // Found by fuzz/fuzz_targets/request_target.rs: the canonical path `/pay%5C%25` is
    // itself read as `/pay/%` by a server that decodes it, so the spelling must be too.
    let target = canonical("/;\\%/pay\\%", true).unwrap();
    assert_eq!(target.path, "/pay%5c%25");
    assert_eq!(target.decoded, ["/%/pay/%", "/pay/%"]);
    let budgets = super::super::Budgets::from_settings(&Default::default());
    let strict = budgets.classify("POST", "/pay/x");
    assert_eq!(budgets.classify("POST", "/;\\%/pay\\%"), strict);
}

#[test]
fn control_characters_and_bad_shapes_are_invalid() {
    assert_eq!(canonical("/a\0b", true), Err(Invalid::Control));
    assert_eq!(canonical("/a%00b", true), Err(Invalid::Control));
    assert_eq!(canonical("/a%0ab", true), Err(Invalid::Control));
    assert_eq!(canonical("/a%25%30%30", true), Err(Invalid::Control));
    assert_eq!(canonical("login", true), Err(Invalid::NotAPath));
    assert_eq!(canonical("", true), Err(Invalid::NotAPath));
    assert_eq!(canonical("?x", true), Err(Invalid::NotAPath));
    let long = format!("/{}", "a".repeat(MAX_TARGET_BYTES));
    assert_eq!(canonical(&long, true), Err(Invalid::TooLong));
    // The query does not count towards the length.
    let query = format!("/a?{}", "q".repeat(10 * MAX_TARGET_BYTES));
    assert_eq!(path(&query), "/a");
}

#[test]
fn plain_paths_are_borrowed() {
    assert!(matches!(
        canonical("/v1/feed", true).unwrap().path,
        Cow::Borrowed("/v1/feed")
    ));
    assert!(matches!(
        canonical("/v1/feed", true).unwrap().path,
        Cow::Borrowed(_)
    ));
    assert!(matches!(
        canonical("/v1/Feed", true).unwrap().path,
        Cow::Owned(_)
    ));
    assert!(matches!(
        canonical("/v1/Feed", false).unwrap().path,
        Cow::Borrowed(_)
    ));
}

#[test]
fn canonical_is_idempotent() {
    for spelling in ["/A//b/./c/../d;x/", "/%41%2fB", "/x\\..\\y", "/%25%32%66"] {
        let once = canonical(spelling, true).unwrap();
        let twice = canonical(&once.path, true).unwrap();
        assert_eq!(once.path, twice.path, "{spelling}");
    }
}

#[test]
fn bytes_outside_ascii_are_escaped_like_their_escapes() {
    for case_insensitive in [true, false] {
        let raw = canonical("/caf\u{e9}/Login", case_insensitive).unwrap();
        let escaped = canonical("/caf%C3%A9/Login", case_insensitive).unwrap();
        assert_eq!(raw.path, escaped.path);
        assert!(raw.path.is_ascii());
    }
    // A raw byte in the query is dropped with the query.
    assert_eq!(path("/login?q=\u{e9}"), "/login");
    assert_eq!(pattern_forms("/Caf\u{e9}", true), vec!["/caf%c3%a9"]);
    assert_eq!(pattern_forms("/Caf\u{e9}", false), vec!["/Caf%C3%A9"]);
    let budgets = super::super::Budgets::from_settings(&Default::default());
    let login = budgets.classify("POST", "/login");
    assert_eq!(budgets.classify("POST", "/login?q=\u{e9}"), login);
    assert_eq!(budgets.classify("POST", "/login\u{a0}"), login);
}

#[test]
fn format_suffixes_dots_and_trailing_spaces_are_also_read_bare() {
    for spelling in [
        "/login.json",
        "/login.JSON",
        "/login.",
        "/login..",
        "/login%20",
        "/login ",
        "/login%c2%a0",
        "/login.json.%20",
        "/login.xml/",
        "/login.json;x",
        "/login%2ejson",
    ] {
        let target = canonical(spelling, true).unwrap();
        assert!(
            target.readings().any(|r| r == "/login"),
            "{spelling}: {:?}",
            target.readings().collect::<Vec<_>>()
        );
    }
    assert_eq!(
        without_suffix("/oauth/token.json").as_deref(),
        Some("/oauth/token")
    );
    // Not suffixes: a dot file, a long extension, a suffix of other characters.
    assert_eq!(without_suffix("/login/%20").as_deref(), Some("/login"));
    assert_eq!(without_suffix("/login/%20.json").as_deref(), Some("/login"));
    assert_eq!(without_suffix("/login/.xml.").as_deref(), Some("/login"));
    for kept in [
        "/.json",
        "/.well-known",
        "/login.abcdefghijk",
        "/login.a-b",
        "/",
        "/login",
        "/%20",
    ] {
        assert_eq!(without_suffix(kept), None, "{kept}");
    }
    // The plain path stays borrowed; the bare form is another reading.
    let target = canonical("/static/app.js", true).unwrap();
    assert!(matches!(target.path, Cow::Borrowed(_)));
    assert_eq!(target.decoded, ["/static/app"]);
    let budgets = super::super::Budgets::from_settings(&Default::default());
    let login = budgets.classify("POST", "/login");
    assert_ne!(
        login,
        budgets.classify("POST", "/logins"),
        "a class of its own"
    );
    for spelling in [
        "/login.json",
        "/login.",
        "/login%20",
        "/Login.Json/",
        "/session.json",
        "/oauth/token.json",
    ] {
        assert_eq!(budgets.classify("POST", spelling), login, "{spelling}");
    }
}

#[test]
fn patterns_take_the_same_form() {
    assert_eq!(pattern_forms("/Auth/*", true), vec!["/auth/*", "/auth"]);
    assert_eq!(pattern_forms("/token/", true), vec!["/token"]);
    assert_eq!(pattern_forms("//a//b", false), vec!["/a/b"]);
    assert_eq!(pattern_forms("*", true), vec!["*"]);
    assert_eq!(pattern_forms("/*", true), vec!["/*"]);
}
