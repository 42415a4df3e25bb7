//! Signed identity: a gateway (or the auth service) signs who the caller is, Palisade checks
//! the signature before it believes a user or device id.
//!
//! Format (stable): `v1.<exp>.<uid>.<did>.<sig>` where `exp` is Unix seconds, `uid` and `did`
//! are base64url without padding (either may be empty), and `sig` is
//! base64url(HMAC-SHA256(secret, "v1.<exp>.<uid>.<did>")). Sent as the header
//! `X-Palisade-Identity` (forward-auth), the field `identity` (`/v1/limit/check`) or the
//! descriptor entry `identity` (Envoy). Secrets come from `forward_auth.identity_secret`: the
//! first signs, every one verifies (rotation).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::Secret;

/// How far past `exp` a signature is still accepted (clocks of gateways drift), seconds.
pub const SKEW_S: i64 = 30;
/// Longest identity accepted, bytes (ids are at most a few hundred characters).
pub const MAX_LEN: usize = 2048;
/// The header forward-auth reads it from.
pub const HEADER: &str = "x-palisade-identity";

/// Who a valid identity names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user id, if signed.
    pub user: Option<String>,
    /// The device id, if signed.
    pub device: Option<String>,
}

/// Why an identity is not believed (the request is then anonymous).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// None was sent.
    #[error("no identity")]
    Missing,
    /// Not `v1.<exp>.<uid>.<did>.<sig>` of base64url parts.
    #[error("malformed identity")]
    Malformed,
    /// Its `exp` is more than [`SKEW_S`] in the past.
    #[error("expired identity")]
    Expired,
    /// No configured secret made its signature.
    #[error("forged identity")]
    Forged,
}

impl Invalid {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Invalid::Missing => "missing",
            Invalid::Malformed => "malformed",
            Invalid::Expired => "expired",
            Invalid::Forged => "forged",
        }
    }
}

fn mac(secret: &Secret) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()).expect("HMAC takes any key length")
}

/// A signed identity for `user` and `device` valid until `exp` (Unix seconds).
pub fn sign(secret: &Secret, exp: i64, user: Option<&str>, device: Option<&str>) -> String {
    let payload = format!(
        "v1.{exp}.{}.{}",
        URL_SAFE_NO_PAD.encode(user.unwrap_or("")),
        URL_SAFE_NO_PAD.encode(device.unwrap_or(""))
    );
    let mut mac = mac(secret);
    mac.update(payload.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{payload}.{signature}")
}

/// Checks `text` against `secrets` at `now_s` (Unix seconds). The signature is compared in
/// constant time (`Mac::verify_slice`).
pub fn verify(secrets: &[Secret], text: Option<&str>, now_s: i64) -> Result<Identity, Invalid> {
    let text = text
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(Invalid::Missing)?;
    if text.len() > MAX_LEN {
        return Err(Invalid::Malformed);
    }
    let (payload, signature) = text.rsplit_once('.').ok_or(Invalid::Malformed)?;
    let mut parts = payload.split('.');
    let (Some("v1"), Some(exp), Some(uid), Some(did), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(Invalid::Malformed);
    };
    let exp: i64 = exp.parse().map_err(|_| Invalid::Malformed)?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| Invalid::Malformed)?;
    let text_of = |part: &str| -> Result<Option<String>, Invalid> {
        let bytes = URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| Invalid::Malformed)?;
        let text = String::from_utf8(bytes).map_err(|_| Invalid::Malformed)?;
        Ok((!text.is_empty()).then_some(text))
    };
    let (user, device) = (text_of(uid)?, text_of(did)?);
    let signed = secrets.iter().any(|secret| {
        let mut mac = mac(secret);
        mac.update(payload.as_bytes());
        mac.verify_slice(&signature).is_ok()
    });
    if !signed {
        return Err(Invalid::Forged);
    }
    if exp.saturating_add(SKEW_S) < now_s {
        return Err(Invalid::Expired);
    }
    Ok(Identity { user, device })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_identity_verifies_with_any_configured_secret_until_it_expires() {
        let (old, new) = (Secret::new("old-secret"), Secret::new("new-secret"));
        let text = sign(&new, 1000, Some("alice"), Some("phone-1"));
        let both = [new.clone(), old.clone()];
        assert_eq!(
            verify(&both, Some(&text), 1000),
            Ok(Identity {
                user: Some("alice".to_owned()),
                device: Some("phone-1".to_owned())
            })
        );
        assert!(verify(&both, Some(&text), 1000 + SKEW_S).is_ok());
        assert_eq!(
            verify(&both, Some(&text), 1001 + SKEW_S),
            Err(Invalid::Expired)
        );
        // Rotation: signed with the old secret, still accepted while it is listed.
        let by_old = sign(&old, 1000, Some("bob"), None);
        assert_eq!(verify(&both, Some(&by_old), 900).unwrap().device, None);
        assert_eq!(
            verify(std::slice::from_ref(&new), Some(&by_old), 900),
            Err(Invalid::Forged)
        );
    }

    #[test]
    fn tampered_or_garbled_identities_are_refused() {
        let secret = Secret::new("s");
        let text = sign(&secret, 1000, Some("alice"), None);
        let other_user = text.replacen(
            &URL_SAFE_NO_PAD.encode("alice"),
            &URL_SAFE_NO_PAD.encode("admin"),
            1,
        );
        let later = text.replacen("v1.1000.", "v1.99999.", 1);
        for forged in [other_user, later] {
            assert_eq!(
                verify(std::slice::from_ref(&secret), Some(&forged), 900),
                Err(Invalid::Forged),
                "{forged}"
            );
        }
        for garbled in [
            "",
            "v1",
            "v2.1.a.b.c",
            "v1.x.a.b.c",
            "v1.1.!!.b.c",
            "v1.1.a.b.c.d",
        ] {
            let expected = if garbled.is_empty() {
                Invalid::Missing
            } else {
                Invalid::Malformed
            };
            assert_eq!(
                verify(std::slice::from_ref(&secret), Some(garbled), 0),
                Err(expected),
                "{garbled}"
            );
        }
        assert_eq!(
            verify(std::slice::from_ref(&secret), Some(&"a".repeat(5000)), 0),
            Err(Invalid::Malformed)
        );
    }
}
