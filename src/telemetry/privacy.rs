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
#[derive(Debug, Clone, Default)]
pub struct Pseudonyms {
    key: Option<Arc<Secret>>,
    on: bool,
}

impl Pseudonyms {
    /// From `[privacy]`.
    pub fn new(settings: &PrivacySettings) -> Self {
        Self {
            key: settings.pseudonym_key.clone().map(Arc::new),
            on: settings.pseudonymize,
        }
    }

    /// Whether logs and webhooks show pseudonyms.
    pub fn enabled(&self) -> bool {
        self.on
    }

    /// `anon-` and 16 hex digits of HMAC-SHA256(key, `id`): the same for the same id, not
    /// reversible without the key. Without a key, a random one (linked to nothing).
    pub fn of(&self, id: &str) -> String {
        let digest = self.digest(id).unwrap_or_else(rand::random);
        let mut text = String::with_capacity(21);
        text.push_str("anon-");
        for byte in digest {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }

    /// The first 8 bytes of HMAC-SHA256(key, `id`); None without a key.
    pub fn digest(&self, id: &str) -> Option<[u8; 8]> {
        let key = self.key.as_ref()?;
        let mut mac = Hmac::<Sha256>::new_from_slice(key.expose().as_bytes())
            .expect("HMAC takes keys of any length");
        mac.update(id.as_bytes());
        let bytes = mac.finalize().into_bytes();
        let mut out = [0u8; 8];
        out.copy_from_slice(&bytes[..8]);
        Some(out)
    }

    /// An identifier as logs and webhooks show it.
    pub fn shown<'a>(&self, id: &'a str) -> Cow<'a, str> {
        if self.on {
            Cow::Owned(self.of(id))
        } else {
            Cow::Borrowed(id)
        }
    }

    /// A subject key (`user:alice`) as logs and webhooks show it: the kind kept, a personal
    /// id pseudonymised; other text (a lockout or token id) as it is.
    pub fn shown_key<'a>(&self, key: &'a str) -> Cow<'a, str> {
        match key.split_once(':') {
            Some((kind, id)) if self.on && PERSONAL.contains(&kind) => {
                Cow::Owned(format!("{kind}:{}", self.of(id)))
            }
            _ => Cow::Borrowed(key),
        }
    }

    /// `text` with every occurrence of `id` pseudonymised (an alert's message names its
    /// subject).
    pub fn shown_in<'a>(&self, text: &'a str, id: &str) -> Cow<'a, str> {
        if self.on && !id.is_empty() && text.contains(id) {
            Cow::Owned(text.replace(id, &self.of(id)))
        } else {
            Cow::Borrowed(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_key(on: bool) -> Pseudonyms {
        Pseudonyms::new(&PrivacySettings {
            pseudonym_key: Some(Secret::new("k".repeat(32))),
            pseudonymize: on,
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
}
