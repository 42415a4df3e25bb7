//! One canonical request target: the path that classification sees, however the request
//! spelled it.
//!
//! A backend serves `/Login`, `//login`, `/%6cogin`, `/login;jsessionid=1`, `/./login` and
//! `/static/../login` as `/login`; a limiter that matched the raw string put them in a laxer
//! class. [`canonical`] applies RFC 3986 normalisation and the usual server leniencies:
//!
//! 1. the query and fragment are dropped;
//! 2. percent-escapes of unreserved characters are decoded (§6.2.2.2), other escapes keep
//!    their bytes with upper-case hex (§6.2.2.1);
//! 3. `;` path parameters are dropped from every segment (`/login;jsessionid=1`, `/..;/x`);
//! 4. empty segments are dropped (repeated slashes collapse, a trailing slash is ignored) and
//!    dot segments are resolved (§5.2.4; `..` never climbs above the root);
//! 5. ASCII letters are lower-cased unless matching is case-sensitive
//!    (`limits.case_insensitive_paths = false`);
//! 6. bytes outside ASCII (raw UTF-8, as nginx passes `$request_uri`) are percent-encoded
//!    with upper-case hex, so `/café` and `/caf%c3%a9` are one path, and the canonical path
//!    is always ASCII.
//!
//! Spellings that servers disagree about (an encoded `/` or `\`, a raw `\`, a double
//! encoding such as `%256c`, a malformed escape) are **ambiguous**: [`Canonical::readings`]
//! then also holds the most-decoded readings (decoded before and after path parameters are
//! dropped, as servers differ in that order too), and the caller classifies every reading and
//! keeps the strictest class. NUL and control characters (raw or encoded), and paths over
//! [`MAX_TARGET_BYTES`], are [`Invalid`].
//!
//! A last segment with a **format suffix**, a trailing dot or trailing whitespace
//! (`/login.json`, `/oauth/token.xml`, `/login.`, `/login%20`) is served as the bare route
//! by Rails (`(.:format)`), older Spring MVC (suffix pattern matching) and servers that trim:
//! every reading then also has its suffix-free form, so `/login.json` is classified as
//! strictly as `/login`.

use std::borrow::Cow;

/// Longest path (after the query is dropped) that is classified.
pub const MAX_TARGET_BYTES: usize = 2048;

/// Why a request target cannot be classified at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Empty, or not starting with `/`.
    #[error("the endpoint must be a path starting with '/'")]
    NotAPath,
    /// Longer than [`MAX_TARGET_BYTES`].
    #[error("the endpoint path is longer than {MAX_TARGET_BYTES} bytes")]
    TooLong,
    /// A NUL or control character, raw or percent-encoded.
    #[error("the endpoint holds a NUL or control character")]
    Control,
}

/// A request target as classification sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical<'a> {
    /// The canonical path (RFC 3986 reading).
    pub path: Cow<'a, str>,
    /// The other readings servers may give the spelling, canonicalised the same way: for an
    /// ambiguous spelling the most-decoded ones (every escape decoded until none is left,
    /// `\` read as `/`: one decoded from the raw spelling, one from the canonical path
    /// after `;` parameters were dropped, when that differs), and for every reading whose
    /// last segment has a format suffix, a trailing dot or trailing whitespace, the reading
    /// without it. Empty otherwise.
    pub decoded: Vec<String>,
}

impl Canonical<'_> {
    /// Every reading to classify: the canonical path, then the decoded ones if ambiguous.
    pub fn readings(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.path).chain(self.decoded.iter().map(String::as_str))
    }

    /// True when servers may read the spelling differently.
    pub fn is_ambiguous(&self) -> bool {
        !self.decoded.is_empty()
    }
}

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

fn hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// The escape at `bytes[at]` (which is `%`), if two hex digits follow.
fn escape_at(bytes: &[u8], at: usize) -> Option<u8> {
    let high = hex(*bytes.get(at + 1)?)?;
    let low = hex(*bytes.get(at + 2)?)?;
    Some(high << 4 | low)
}

/// Checks a target without normalising it: what `/v1/limit/check` and forward-auth refuse
/// with 400.
pub fn validate(target: &str) -> Result<(), Invalid> {
    canonical(target, false).map(|_| ())
}

/// The canonical form of `target` (a path, optionally with a query and fragment).
pub fn canonical(target: &str, case_insensitive: bool) -> Result<Canonical<'_>, Invalid> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(Invalid::NotAPath);
    }
    if path.len() > MAX_TARGET_BYTES {
        return Err(Invalid::TooLong);
    }
    let bytes = path.as_bytes();
    if bytes.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(Invalid::Control);
    }
    if is_plain(bytes, case_insensitive) {
        let mut target = Canonical {
            path: Cow::Borrowed(path),
            decoded: Vec::new(),
        };
        target.add_suffix_free_readings();
        return Ok(target);
    }
    // First pass: RFC 3986 decoding of unreserved escapes, noting ambiguity.
    let mut text = Vec::with_capacity(bytes.len());
    let mut ambiguous = false;
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b'%' => match escape_at(bytes, at) {
                Some(value) if value < 0x20 || value == 0x7f => return Err(Invalid::Control),
                Some(value) if is_unreserved(value) => {
                    text.push(value);
                    at += 3;
                    continue;
                }
                Some(value) => {
                    // `/`, `\` and `%` itself (a double encoding) decode to something a
                    // server may act on.
                    ambiguous |= matches!(value, b'/' | b'\\' | b'%');
                    text.extend_from_slice(&percent(value));
                    at += 3;
                    continue;
                }
                None => {
                    // A malformed escape: kept as the literal `%` it is.
                    ambiguous = true;
                    text.extend_from_slice(b"%25");
                }
            },
            b'\\' => {
                ambiguous = true;
                text.extend_from_slice(b"%5C");
            }
            0x80.. => text.extend_from_slice(&percent(byte)),
            _ => text.push(byte),
        }
        at += 1;
    }
    let path = normalise(&text, case_insensitive);
    let mut decoded = Vec::new();
    if ambiguous {
        // `/;\%/pay\%`: decoding first reads `/%/pay/%`; dropping the `;\%` parameter first
        // reads `/pay/%`. Both orders exist among servers.
        for source in [bytes, path.as_bytes()] {
            let reading = normalise(&most_decoded(source)?, case_insensitive);
            if reading != path && !decoded.contains(&reading) {
                decoded.push(reading);
            }
        }
    }
    let mut target = Canonical {
        path: Cow::Owned(path),
        decoded,
    };
    target.add_suffix_free_readings();
    Ok(target)
}

impl Canonical<'_> {
    /// Adds, for every reading so far, its form without a trailing format suffix, dot or
    /// whitespace (when it has one and that form is not already a reading).
    fn add_suffix_free_readings(&mut self) {
        let mut found: Vec<String> = Vec::new();
        for reading in self.readings() {
            if let Some(bare) = without_suffix(reading)
                && bare != *self.path
                && !self.decoded.contains(&bare)
                && !found.contains(&bare)
            {
                found.push(bare);
            }
        }
        self.decoded.append(&mut found);
    }
}

/// Longest format suffix (after the dot) that is read as one: `.json`, `.xml`, `.html`,
/// `.php`, `.action`, `.jsonapi`…
const MAX_SUFFIX: usize = 10;

/// `path` without what servers strip from its end before routing: trailing whitespace (raw,
/// `%20`, `%C2%A0`), trailing dots and a format suffix (`.` then 1 to [`MAX_SUFFIX`] ASCII
/// letters or digits), repeatedly (`/login.json.%20` is `/login`); a last segment of only
/// such a tail goes with its slash (`/login/%20` and `/login/.json` are `/login`). None when
/// there is nothing to strip.
fn without_suffix(path: &str) -> Option<String> {
    let mut end = path.len();
    loop {
        let start = path[..end].rfind('/').map_or(0, |at| at + 1);
        let segment = &path[start..end];
        let rest = segment
            .strip_suffix(' ')
            .or_else(|| segment.strip_suffix("%20"))
            .or_else(|| segment.strip_suffix("%C2%A0"))
            .or_else(|| segment.strip_suffix("%c2%a0"))
            .or_else(|| segment.strip_suffix('.'));
        let cut = match rest {
            Some(rest) => rest.len(),
            None => match segment.rfind('.') {
                Some(dot)
                    if (1..=MAX_SUFFIX).contains(&(segment.len() - dot - 1))
                        && segment[dot + 1..]
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric()) =>
                {
                    dot
                }
                _ => break,
            },
        };
        if cut > 0 {
            end = start + cut;
        } else if start > 1 {
            // The whole segment was such a tail: the slash before it goes too.
            end = start - 1;
        } else {
            break;
        }
    }
    (end < path.len()).then(|| path[..end].to_owned())
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// `byte` as a percent-escape with upper-case hex.
fn percent(byte: u8) -> [u8; 3] {
    [
        b'%',
        HEX[usize::from(byte >> 4)],
        HEX[usize::from(byte & 15)],
    ]
}

/// True when `bytes` is already canonical: no escapes, backslashes or path parameters, no
/// empty or dot segments, no trailing slash, and no upper case when matching ignores case.
fn is_plain(bytes: &[u8], case_insensitive: bool) -> bool {
    let special = bytes.iter().any(|&b| {
        matches!(b, b'%' | b'\\' | b';' | 0x80..) || (case_insensitive && b.is_ascii_uppercase())
    });
    if special || (bytes.len() > 1 && bytes.ends_with(b"/")) {
        return false;
    }
    !bytes[1..]
        .split(|&b| b == b'/')
        .any(|segment| matches!(segment, b"" | b"." | b"..") && bytes.len() > 1)
}

/// Every escape decoded, again and again until none is left (at most four rounds: `%25`
/// nests), and `\` read as `/`: the reading of the most lenient server.
fn most_decoded(bytes: &[u8]) -> Result<Vec<u8>, Invalid> {
    let mut current = bytes.to_vec();
    for _ in 0..4 {
        let mut next = Vec::with_capacity(current.len());
        let mut changed = false;
        let mut at = 0;
        while at < current.len() {
            if current[at] == b'%'
                && let Some(value) = escape_at(&current, at)
            {
                if value < 0x20 || value == 0x7f {
                    return Err(Invalid::Control);
                }
                next.push(value);
                changed = true;
                at += 3;
                continue;
            }
            next.push(current[at]);
            at += 1;
        }
        current = next;
        if !changed {
            break;
        }
    }
    for byte in &mut current {
        if *byte == b'\\' {
            *byte = b'/';
        }
    }
    Ok(current)
}

/// Steps 3-5 on decoded bytes: path parameters, empty and dot segments, case.
fn normalise(bytes: &[u8], case_insensitive: bool) -> String {
    let mut segments: Vec<&[u8]> = Vec::new();
    for segment in bytes.split(|&b| b == b'/') {
        let segment = match segment.iter().position(|&b| b == b';') {
            Some(at) => &segment[..at],
            None => segment,
        };
        match segment {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let mut out = Vec::with_capacity(bytes.len() + 1);
    for segment in &segments {
        out.push(b'/');
        for &byte in *segment {
            // A most-decoded reading may hold bytes outside ASCII: escaped as the canonical
            // path escapes them, so patterns meet both in one form.
            if byte >= 0x80 {
                out.extend_from_slice(&percent(byte));
            } else {
                out.push(byte);
            }
        }
    }
    if out.is_empty() {
        out.push(b'/');
    }
    if case_insensitive {
        out.make_ascii_lowercase();
    }
    // Every byte outside ASCII was escaped above.
    String::from_utf8(out).expect("ASCII")
}

/// The forms a configured path pattern is matched in.
///
/// Case as the paths are, repeated slashes collapsed, one trailing slash dropped. A pattern
/// ending in `/*` also matches its prefix exactly (the request `/auth/` is canonical `/auth`,
/// which `/auth/*` must still cover): returned as a second pattern.
pub fn pattern_forms(pattern: &str, case_insensitive: bool) -> Vec<String> {
    let mut text = String::with_capacity(pattern.len());
    for ch in pattern.chars() {
        if ch == '/' && text.ends_with('/') {
            continue;
        }
        if !ch.is_ascii() {
            // Raw UTF-8 in a pattern meets requests in their escaped form.
            let mut buf = [0u8; 4];
            for &byte in ch.encode_utf8(&mut buf).as_bytes() {
                let escape = percent(byte).map(char::from);
                text.extend(escape.map(|c| {
                    if case_insensitive {
                        c.to_ascii_lowercase()
                    } else {
                        c
                    }
                }));
            }
            continue;
        }
        text.push(if case_insensitive {
            ch.to_ascii_lowercase()
        } else {
            ch
        });
    }
    if text.len() > 1 && text.ends_with('/') {
        text.pop();
    }
    let mut forms = vec![text.clone()];
    if let Some(prefix) = text.strip_suffix("/*")
        && !prefix.is_empty()
    {
        forms.push(prefix.to_owned());
    }
    forms
}

#[cfg(test)]
mod tests {
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
}
