//! Nouns shared by two or more domains: subject keys, client IPs, reasons.

pub mod encoding; // the text forms of attestation keys and digests
mod ids; // the ids a subject is known by: their profiles and checks
mod ip; // client addresses and how they are keyed

use ids::check_length;
pub use ids::{AccountIds, IdProblem, Identifiers, InvalidId, free_text, one_line};
pub use ip::ClientIp;

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// Why, as a stable code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Reason {
    /// Stable machine-readable code, e.g. `account_failures`.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
}

impl Reason {
    /// A reason.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
    }
}

/// The kind of a subject key (`ip:…`, `user:…`, `device:…`, `asn:…`) or the global bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SubjectKind {
    /// All traffic.
    Global,
    /// A client IP (IPv6: its configured prefix).
    Ip,
    /// An end user (or account, on auth endpoints).
    User,
    /// A device id.
    Device,
    /// An autonomous system.
    Asn,
    /// A tenant: the partner, customer or app a request is made for, as the gateway
    /// authenticated it (an API key's owner).
    Tenant,
    /// Who a message or notification goes to: an E.164 phone number, an e-mail address or
    /// a push token's hash, in canonical form (`messaging::Recipient`).
    Recipient,
    /// Where messages go in bulk: a phone number's country code and leading digits, or an
    /// e-mail address's domain.
    Destination,
}

impl SubjectKind {
    /// The prefix in the key's text form.
    pub fn as_str(self) -> &'static str {
        match self {
            SubjectKind::Global => "global",
            SubjectKind::Ip => "ip",
            SubjectKind::User => "user",
            SubjectKind::Device => "device",
            SubjectKind::Asn => "asn",
            SubjectKind::Tenant => "tenant",
            SubjectKind::Recipient => "recipient",
            SubjectKind::Destination => "destination",
        }
    }
}

/// A subject key such as `ip:203.0.113.7`, `ip:2001:db8:1:2::/64` or `user:42`.
///
/// Built only through the constructors, which normalise and bound the id; the text form is
/// safe to embed in a Redis key (no `{`, `}`, whitespace or control characters: they are
/// percent-encoded).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubjectKey {
    kind: SubjectKind,
    /// The whole text form (`ip:…`), built once: keys are made from it on every check.
    text: std::sync::Arc<str>,
}

fn encode(id: &str) -> std::borrow::Cow<'_, str> {
    // Printable ASCII other than the three: nothing to encode (the common case, checked
    // byte by byte).
    if id
        .bytes()
        .all(|b| b > b' ' && b < 0x7f && b != b'{' && b != b'}' && b != b'%')
    {
        return std::borrow::Cow::Borrowed(id);
    }
    let clean =
        |ch: char| !(ch == '{' || ch == '}' || ch == '%' || ch.is_whitespace() || ch.is_control());
    if id.chars().all(clean) {
        return std::borrow::Cow::Borrowed(id);
    }
    let mut out = String::with_capacity(id.len());
    for ch in id.chars() {
        if ch == '{' || ch == '}' || ch == '%' || ch.is_whitespace() || ch.is_control() {
            let mut buf = [0u8; 4];
            for byte in ch.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(ch);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Keys up to this many bytes are assembled without a temporary `String`.
const SHORT_KEY: usize = 128;

impl SubjectKey {
    /// The single global subject.
    pub fn global() -> Self {
        // Made once: every check with a global budget keys it.
        static TEXT: std::sync::LazyLock<std::sync::Arc<str>> =
            std::sync::LazyLock::new(|| "global".into());
        Self {
            kind: SubjectKind::Global,
            text: TEXT.clone(),
        }
    }

    fn with_id(kind: SubjectKind, id: &str) -> Self {
        let prefix = kind.as_str();
        let len = prefix.len() + 1 + id.len();
        let text: std::sync::Arc<str> = if len <= SHORT_KEY {
            // Assembled on the stack: the Arc is the key's only allocation.
            let mut buf = [0u8; SHORT_KEY];
            buf[..prefix.len()].copy_from_slice(prefix.as_bytes());
            buf[prefix.len()] = b':';
            buf[prefix.len() + 1..len].copy_from_slice(id.as_bytes());
            std::str::from_utf8(&buf[..len])
                .expect("joined from two strs and an ASCII colon")
                .into()
        } else {
            format!("{prefix}:{id}").into()
        };
        Self { kind, text }
    }

    /// A client IP, normalised by [`ClientIp`].
    pub fn ip(ip: &ClientIp) -> Self {
        // Written straight into the key's text (no intermediate string).
        let mut text = String::with_capacity(3 + 48);
        text.push_str("ip:");
        ip.write_key(&mut text);
        Self {
            kind: SubjectKind::Ip,
            text: text.into(),
        }
    }

    /// The network of a client that rotates addresses: an IPv4 address's /24, an IPv6
    /// address's /48 (`ip:203.0.113.0/24`, `ip:2001:db8:1::/48`).
    pub fn ip_network(ip: &ClientIp) -> Self {
        let text = match ip.addr() {
            IpAddr::V4(v4) => {
                let [a, b, c, _] = v4.octets();
                format!("{a}.{b}.{c}.0/24")
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & (u128::MAX << 80);
                format!("{}/48", Ipv6Addr::from(bits))
            }
        };
        Self::with_id(SubjectKind::Ip, &text)
    }

    /// A user id of at most `max_len` characters, taken as it is: ids from outside come
    /// through [`Identifiers::user_key`], which makes them canonical first.
    pub fn user(id: &str, max_len: usize) -> Result<Self, InvalidId> {
        Self::bounded(SubjectKind::User, "user_id", id, max_len)
    }

    /// A device id of at most `max_len` characters, taken as it is (ids from outside come
    /// through [`Identifiers::device_key`]).
    pub fn device(id: &str, max_len: usize) -> Result<Self, InvalidId> {
        Self::bounded(SubjectKind::Device, "device_id", id, max_len)
    }

    /// A tenant id of at most `max_len` characters, taken as it is (ids from outside come
    /// through [`Identifiers::tenant_key`]).
    pub fn tenant(id: &str, max_len: usize) -> Result<Self, InvalidId> {
        Self::bounded(SubjectKind::Tenant, "tenant", id, max_len)
    }

    /// A messaging recipient or destination, already canonical (`messaging::Recipient`
    /// builds them).
    pub fn messaging(kind: SubjectKind, canonical: &str) -> Self {
        debug_assert!(matches!(
            kind,
            SubjectKind::Recipient | SubjectKind::Destination
        ));
        Self::with_id(kind, &encode(canonical))
    }

    /// An autonomous system number.
    pub fn asn(asn: u32) -> Self {
        Self::with_id(SubjectKind::Asn, &asn.to_string())
    }

    fn bounded(
        kind: SubjectKind,
        field: &'static str,
        id: &str,
        max_len: usize,
    ) -> Result<Self, InvalidId> {
        check_length(field, id, max_len)?;
        Ok(Self::with_id(kind, &encode(id)))
    }

    /// Reads back a key's text form (`ip:…`, `user:…`, `device:…`, `asn:…`, `tenant:…`,
    /// `recipient:…`, `destination:…`, `global`), as
    /// built by the constructors and stored in the hot store. None for anything else.
    pub fn from_text(text: &str) -> Option<Self> {
        if text == "global" {
            return Some(Self::global());
        }
        let (kind, id) = text.split_once(':')?;
        let kind = match kind {
            "ip" => SubjectKind::Ip,
            "user" => SubjectKind::User,
            "device" => SubjectKind::Device,
            "asn" => SubjectKind::Asn,
            "tenant" => SubjectKind::Tenant,
            "recipient" => SubjectKind::Recipient,
            "destination" => SubjectKind::Destination,
            _ => return None,
        };
        let clean = !id.is_empty()
            && !id
                .chars()
                .any(|ch| ch == '{' || ch == '}' || ch.is_whitespace() || ch.is_control());
        clean.then(|| Self::with_id(kind, id))
    }

    /// The address of an `ip:` key (for an IPv6 prefix key, its first address).
    pub fn ip_addr(&self) -> Option<IpAddr> {
        if self.kind != SubjectKind::Ip {
            return None;
        }
        let id = &self.text[3..];
        id.split('/').next()?.parse().ok()
    }

    /// The number of an `asn:` key.
    pub fn asn_number(&self) -> Option<u32> {
        if self.kind != SubjectKind::Asn {
            return None;
        }
        self.text[4..].parse().ok()
    }

    /// The kind.
    pub fn kind(&self) -> SubjectKind {
        self.kind
    }

    /// The text form, `ip:203.0.113.7`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The id without its kind: `203.0.113.7` of `ip:203.0.113.7` (what logs pseudonymise).
    pub fn id(&self) -> &str {
        self.text.split_once(':').map_or(&*self.text, |(_, id)| id)
    }

    /// The text form, shared (cheap to clone).
    pub fn shared(&self) -> std::sync::Arc<str> {
        self.text.clone()
    }
}

impl fmt::Display for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_and_encoded_for_redis_keys() {
        assert!(SubjectKey::user("", 8).is_err());
        assert!(SubjectKey::user("123456789", 8).is_err());
        assert_eq!(
            SubjectKey::user("a}b {c", 16).unwrap().to_string(),
            "user:a%7Db%20%7Bc"
        );
        assert_eq!(
            SubjectKey::device("dev-1", 16).unwrap().to_string(),
            "device:dev-1"
        );
        assert_eq!(SubjectKey::global().to_string(), "global");
    }

    const IDS: Identifiers = Identifiers {
        accounts: AccountIds::CaseInsensitive,
        max_len: 64,
    };

    #[test]
    fn spellings_of_one_account_are_one_account() {
        for spelling in [
            "alice@example.com",
            "Alice@Example.com",
            "ALICE@EXAMPLE.COM",
            "  alice@example.com\t",
            "\u{ff41}\u{ff4c}\u{ff49}\u{ff43}\u{ff45}@example.com",
            "\u{ff21}LICE@example.com",
        ] {
            assert_eq!(
                IDS.account("account", spelling).unwrap(),
                "alice@example.com",
                "{spelling:?}"
            );
        }
        // Full case folding (not lower-casing): ß and ẞ are ss, K (Kelvin) is k.
        assert_eq!(IDS.account("account", "STRASSE").unwrap(), "strasse");
        assert_eq!(IDS.account("account", "Straße").unwrap(), "strasse");
        assert_eq!(IDS.account("account", "\u{212a}im").unwrap(), "kim");
        // Composed and decomposed accents are one account.
        assert_eq!(
            IDS.account("account", "Jose\u{301}").unwrap(),
            IDS.account("account", "jos\u{e9}").unwrap()
        );
    }

    #[test]
    fn idna_full_stops_are_dots_and_accents_fold_only_when_asked() {
        for spelling in [
            "victim@example\u{3002}com",
            "victim@example\u{ff0e}com",
            "victim@example\u{ff61}com",
        ] {
            assert_eq!(
                IDS.account("account", spelling).unwrap(),
                "victim@example.com",
                "{spelling:?}"
            );
        }
        // The default keeps accents: víctim is another account (as a binary-collated backend
        // sees it).
        assert_eq!(
            IDS.account("account", "v\u{ed}ctim@x").unwrap(),
            "v\u{ed}ctim@x"
        );
        let accents = Identifiers {
            accounts: AccountIds::AccentInsensitive,
            max_len: 64,
        };
        for spelling in [
            "victim@example.com",
            "V\u{ed}ctim@example.com",
            "vi\u{301}ctim@example.com",
            "v\u{130}ctim@example.com",
            "v\u{ec}ct\u{ef}m@\u{e9}xample\u{3002}com",
            "\u{ff56}ictim@example.com",
        ] {
            assert_eq!(
                accents.account("account", spelling).unwrap(),
                "victim@example.com",
                "{spelling:?}"
            );
        }
        assert_eq!(accents.account("account", "S\u{f8}ren").unwrap(), "soren");
        assert_eq!(
            accents.account("account", "\u{141}ukasz").unwrap(),
            "lukasz"
        );
        assert_eq!(
            accents.account("account", "Stra\u{df}e").unwrap(),
            "strasse"
        );
        // Scripts without accents are kept; a canonical id is its own canonical id.
        for id in [
            "\u{43c}\u{430}\u{448}\u{430}",
            "\u{5c71}\u{7530}",
            "\u{e0}\u{1ec7}\u{31}",
        ] {
            let once = accents.account("account", id).unwrap();
            assert_eq!(accents.account("account", &once).unwrap(), once, "{id:?}");
        }
    }

    #[test]
    fn free_text_and_one_line() {
        assert_eq!(free_text("  why  ", 10), Ok("why"));
        assert_eq!(free_text("", 10), Err(IdProblem::Length(10)));
        assert_eq!(free_text("a\rb", 10), Err(IdProblem::Control));
        assert_eq!(free_text("a\u{202e}b", 10), Err(IdProblem::Invisible));
        assert_eq!(free_text("a\u{2067}b", 10), Err(IdProblem::Invisible));
        assert_eq!(one_line("a\rb\nc\u{202e}d\u{7f}"), "a b c d ");
        assert!(matches!(
            one_line("plain \u{e9}"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn invisible_and_control_characters_are_refused() {
        for (spelling, problem) in [
            ("ali\u{200b}ce", IdProblem::Invisible),
            ("ali\u{200d}ce", IdProblem::Invisible),
            ("ali\u{ad}ce", IdProblem::Invisible),
            ("alice\u{fe0f}", IdProblem::Invisible),
            ("\u{202e}ecila", IdProblem::Invisible),
            ("ali\u{0}ce", IdProblem::Control),
            ("ali\nce", IdProblem::Control),
            ("ali\u{85}ce", IdProblem::Control),
            ("", IdProblem::Length(64)),
            ("   ", IdProblem::Length(64)),
        ] {
            assert_eq!(
                IDS.account("account", spelling),
                Err(InvalidId {
                    field: "account",
                    problem
                }),
                "{spelling:?}"
            );
        }
        assert_eq!(
            IDS.device("dev\u{200b}1").unwrap_err().problem,
            IdProblem::Invisible
        );
    }

    #[test]
    fn exact_ids_are_kept_byte_for_byte_and_devices_keep_case() {
        let exact = Identifiers {
            accounts: AccountIds::Exact,
            ..IDS
        };
        assert_eq!(exact.account("account", "Alice ").unwrap(), "Alice ");
        assert!(exact.account("account", "a\u{200b}").is_err());
        assert_eq!(IDS.device(" Dev-ABC ").unwrap(), "Dev-ABC");
        assert_eq!(
            IDS.device_key("Dev-ABC").unwrap().to_string(),
            "device:Dev-ABC"
        );
        assert_eq!(
            IDS.user_key("user_id", "Bob").unwrap(),
            SubjectKey::user("bob", 8).unwrap()
        );
    }

    #[test]
    fn text_forms_read_back_to_the_same_key() {
        let ip = SubjectKey::ip(&ClientIp::parse("2001:db8:1:2::9", 64).unwrap());
        let keys = [
            ip.clone(),
            SubjectKey::ip(&ClientIp::parse("203.0.113.7", 64).unwrap()),
            SubjectKey::user("a}b {c", 16).unwrap(),
            SubjectKey::device("dev-1", 16).unwrap(),
            SubjectKey::asn(64500),
            SubjectKey::tenant("acme app", 16).unwrap(),
            SubjectKey::global(),
        ];
        for key in keys {
            assert_eq!(SubjectKey::from_text(key.as_str()), Some(key.clone()));
        }
        assert_eq!(ip.ip_addr().unwrap().to_string(), "2001:db8:1:2::");
        assert_eq!(SubjectKey::asn(64500).asn_number(), Some(64500));
        assert_eq!(SubjectKey::from_text("user:has space"), None);
        assert_eq!(SubjectKey::from_text("bogus:1"), None);
    }
}
