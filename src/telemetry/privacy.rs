//! Pseudonyms: how accounts, devices and addresses are named where they leave the service
//! (logs, alert webhooks, the audit entry of an erasure) under `[privacy]`.

use std::borrow::Cow;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::{PrivacySettings, Secret};

/// Subject-key kinds whose id is personal data (`user:…`, `device:…`, `ip:…`).
const PERSONAL: &[&str] = &["user", "device", "ip"];

/// Makes and applies pseudonyms (cheap to clone).
///
/// `shown`, `shown_key` and `shown_in` name identifiers as **logs** show them: pseudonyms
/// unless `privacy.clear_logs`. [`Pseudonyms::webhooks`] is the same for alert webhooks,
/// which show pseudonyms only under `privacy.pseudonymize`.
#[derive(Debug, Clone, Default)]
pub struct Pseudonyms {
    key: Option<Arc<Secret>>,
    /// Whether the `shown*` methods pseudonymise.
    on: bool,
    /// Whether webhooks do.
    webhooks: bool,
}

/// The key of log pseudonyms when no `pseudonym_key` is set: made at start, so pseudonyms
/// link lines of one run and nothing after a restart.
fn run_key() -> &'static Secret {
    static KEY: std::sync::OnceLock<Secret> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let bytes: [u8; 32] = rand::random();
        Secret::new(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    })
}

impl Pseudonyms {
    /// From `[privacy]`.
    pub fn new(settings: &PrivacySettings) -> Self {
        Self {
            key: settings.pseudonym_key.clone().map(Arc::new),
            on: settings.pseudonymize || !settings.clear_logs,
            webhooks: settings.pseudonymize,
        }
    }

    /// The rule of alert webhooks: pseudonyms only under `privacy.pseudonymize`.
    pub fn webhooks(&self) -> Self {
        Self {
            key: self.key.clone(),
            on: self.webhooks,
            webhooks: self.webhooks,
        }
    }

    /// Whether logs (or, from [`Self::webhooks`], webhooks) show pseudonyms.
    pub fn enabled(&self) -> bool {
        self.on
    }

    /// `anon-` and 16 hex digits of HMAC-SHA256(key, `id`): the same for the same id, not
    /// reversible without the key. Without a key, a random one (linked to nothing).
    pub fn of(&self, id: &str) -> String {
        hex(self.digest(id).unwrap_or_else(rand::random))
    }

    /// The first 8 bytes of HMAC-SHA256(key, `id`); None without a key.
    pub fn digest(&self, id: &str) -> Option<[u8; 8]> {
        Some(digest(self.key.as_deref()?, id))
    }

    /// A pseudonym as shown: keyed by `pseudonym_key`, else by the run's own key.
    fn shown_as(&self, id: &str) -> String {
        hex(digest(self.key.as_deref().unwrap_or_else(|| run_key()), id))
    }

    /// An identifier as logs show it.
    pub fn shown<'a>(&self, id: &'a str) -> Cow<'a, str> {
        if self.on {
            Cow::Owned(self.shown_as(id))
        } else {
            Cow::Borrowed(id)
        }
    }

    /// A subject key (`user:alice`) as logs show it: the kind kept, a personal id
    /// pseudonymised; other text (a lockout or token id) as it is.
    pub fn shown_key<'a>(&self, key: &'a str) -> Cow<'a, str> {
        match key.split_once(':') {
            Some((kind, id)) if self.on && PERSONAL.contains(&kind) => {
                Cow::Owned(format!("{kind}:{}", self.shown_as(id)))
            }
            _ => Cow::Borrowed(key),
        }
    }

    /// `text` with every occurrence of `id` pseudonymised (an alert's message names its
    /// subject).
    pub fn shown_in<'a>(&self, text: &'a str, id: &str) -> Cow<'a, str> {
        if self.on && !id.is_empty() && text.contains(id) {
            Cow::Owned(text.replace(id, &self.shown_as(id)))
        } else {
            Cow::Borrowed(text)
        }
    }
}

fn digest(key: &Secret, id: &str) -> [u8; 8] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.expose().as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(id.as_bytes());
    let bytes = mac.finalize().into_bytes();
    let mut out = [0u8; 8];
    out.copy_from_slice(&bytes[..8]);
    out
}

fn hex(digest: [u8; 8]) -> String {
    let mut text = String::with_capacity(21);
    text.push_str("anon-");
    for byte in digest {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_key(on: bool) -> Pseudonyms {
        Pseudonyms::new(&PrivacySettings {
            pseudonym_key: Some(Secret::new("k".repeat(32))),
            pseudonymize: on,
            clear_logs: !on,
        })
    }

    #[test]
    fn a_keyed_pseudonym_is_stable_and_hides_the_id() {
        let p = with_key(true);
        let a = p.of("alice@example.com");
        assert_eq!(a, p.of("alice@example.com"));
        assert_ne!(a, p.of("bob@example.com"));
        assert!(a.starts_with("anon-") && a.len() == 21 && !a.contains("alice"));
        // Another key, another pseudonym.
        let other = Pseudonyms::new(&PrivacySettings {
            pseudonym_key: Some(Secret::new("x".repeat(32))),
            pseudonymize: true,
            clear_logs: false,
        });
        assert_ne!(a, other.of("alice@example.com"));
        assert_eq!(p.shown_key("user:alice"), format!("user:{}", p.of("alice")));
        assert_eq!(
            p.shown_key("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
            "01ARZ3NDEKTSV4RRFFQ69G5FAV"
        );
        assert_eq!(
            p.shown_in("alice: locked after 10 failed logins", "alice"),
            format!("{}: locked after 10 failed logins", p.of("alice"))
        );
    }

    #[test]
    fn off_shows_ids_and_without_a_key_pseudonyms_are_random() {
        let p = with_key(false);
        assert_eq!(p.shown("alice"), "alice");
        assert_eq!(p.shown_key("user:alice"), "user:alice");
        let unkeyed = Pseudonyms::default();
        assert_ne!(unkeyed.of("alice"), unkeyed.of("alice"));
    }

    /// By default logs show pseudonyms (linked within the run, without a key) and webhooks
    /// show identifiers; `clear_logs` shows them in logs, `pseudonymize` hides them in both.
    #[test]
    fn logs_hide_identifiers_by_default_and_webhooks_on_request() {
        let default = Pseudonyms::new(&PrivacySettings::default());
        let logged = default.shown("alice@example.com");
        assert!(logged.starts_with("anon-") && !logged.contains("alice"));
        assert_eq!(
            logged,
            default.shown("alice@example.com"),
            "linked within the run"
        );
        assert_eq!(
            Pseudonyms::new(&PrivacySettings::default()).shown_key("ip:203.0.113.9"),
            format!("ip:{}", default.shown("203.0.113.9")),
            "every handle of the run names an id alike"
        );
        assert_eq!(default.webhooks().shown("alice"), "alice");
        let clear = Pseudonyms::new(&PrivacySettings {
            clear_logs: true,
            ..PrivacySettings::default()
        });
        assert_eq!(clear.shown("alice"), "alice");
        let hidden = with_key(true);
        assert_eq!(hidden.webhooks().shown("alice"), hidden.of("alice"));
        assert_eq!(hidden.shown("alice"), hidden.of("alice"));
    }
}
