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
mod tests;
