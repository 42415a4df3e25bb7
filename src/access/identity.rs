//! Signed identity: a gateway (or the auth service) signs who the caller is, Palisade checks
//! the signature before it believes a user, device or tenant id.
//!
//! Formats (stable): `v1.<exp>.<uid>.<did>.<sig>` and `v2.<exp>.<uid>.<did>.<tid>.<sig>`,
//! where `exp` is Unix seconds, `uid`, `did` and `tid` (the tenant) are base64url without
//! padding (any may be empty), and `sig` is base64url(HMAC-SHA256(secret, everything before
//! the last dot)). A v1 identity names no tenant. Sent as the header `X-Palisade-Identity`
//! (forward-auth), the field `identity` (`/v1/limit/check`) or the descriptor entry
//! `identity` (Envoy). Secrets come from `forward_auth.identity_secret`: the first signs,
//! every one verifies (rotation).

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
    /// The tenant, if signed (v2 only).
    pub tenant: Option<String>,
}

/// Why an identity is not believed (the request is then anonymous).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// None was sent.
    #[error("no identity")]
    Missing,
    /// Not `v1.<exp>.<uid>.<did>.<sig>` or `v2.<exp>.<uid>.<did>.<tid>.<sig>` of base64url
    /// parts.
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

/// A signed identity for `user`, `device` and `tenant` valid until `exp` (Unix seconds): v1
/// without a tenant, v2 with one.
pub fn sign(
    secret: &Secret,
    exp: i64,
    user: Option<&str>,
    device: Option<&str>,
    tenant: Option<&str>,
) -> String {
    let part = |id: Option<&str>| URL_SAFE_NO_PAD.encode(id.unwrap_or(""));
    let payload = match tenant {
        None => format!("v1.{exp}.{}.{}", part(user), part(device)),
        Some(tenant) => format!(
            "v2.{exp}.{}.{}.{}",
            part(user),
            part(device),
            part(Some(tenant))
        ),
    };
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
    let parts: Vec<&str> = payload.splitn(7, '.').collect();
    let (exp, uid, did, tid) = match parts.as_slice() {
        ["v1", exp, uid, did] => (*exp, *uid, *did, ""),
        ["v2", exp, uid, did, tid] => (*exp, *uid, *did, *tid),
        _ => return Err(Invalid::Malformed),
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
    let (user, device, tenant) = (text_of(uid)?, text_of(did)?, text_of(tid)?);
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
    Ok(Identity {
        user,
        device,
        tenant,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_identity_verifies_with_any_configured_secret_until_it_expires() {
        let (old, new) = (Secret::new("old-secret"), Secret::new("new-secret"));
        let text = sign(&new, 1000, Some("alice"), Some("phone-1"), None);
        let both = [new.clone(), old.clone()];
        assert_eq!(
            verify(&both, Some(&text), 1000),
            Ok(Identity {
                user: Some("alice".to_owned()),
                device: Some("phone-1".to_owned()),
                tenant: None,
            })
        );
        assert!(verify(&both, Some(&text), 1000 + SKEW_S).is_ok());
        assert_eq!(
            verify(&both, Some(&text), 1001 + SKEW_S),
            Err(Invalid::Expired)
        );
        // Rotation: signed with the old secret, still accepted while it is listed.
        let by_old = sign(&old, 1000, Some("bob"), None, None);
        assert_eq!(verify(&both, Some(&by_old), 900).unwrap().device, None);
        assert_eq!(
            verify(std::slice::from_ref(&new), Some(&by_old), 900),
            Err(Invalid::Forged)
        );
    }

    #[test]
    fn a_v2_identity_signs_the_tenant_and_no_version_passes_for_the_other() {
        let secret = Secret::new("s");
        let keys = std::slice::from_ref(&secret);
        let text = sign(&secret, 1000, Some("alice"), None, Some("acme"));
        assert!(text.starts_with("v2.1000."), "{text}");
        assert_eq!(
            verify(keys, Some(&text), 1000),
            Ok(Identity {
                user: Some("alice".to_owned()),
                device: None,
                tenant: Some("acme".to_owned()),
            })
        );
        let acme = URL_SAFE_NO_PAD.encode("acme");
        let (v1_payload, v1_sig) = sign(&secret, 1000, Some("alice"), None, None)
            .rsplit_once('.')
            .map(|(p, s)| (p.to_owned(), s.to_owned()))
            .unwrap();
        // Another tenant, a tenant added to a v1 signature, the tenant dropped from a v2 one.
        let other = text.replacen(&acme, &URL_SAFE_NO_PAD.encode("globex"), 1);
        let added = format!("{}.{acme}.{v1_sig}", v1_payload.replacen("v1.", "v2.", 1));
        let (v2_payload, v2_sig) = text.rsplit_once('.').unwrap();
        let dropped = format!(
            "{}.{v2_sig}",
            v2_payload
                .strip_suffix(&format!(".{acme}"))
                .unwrap()
                .replacen("v2.", "v1.", 1)
        );
        for forged in [other, added, dropped] {
            assert_eq!(
                verify(keys, Some(&forged), 900),
                Err(Invalid::Forged),
                "{forged}"
            );
        }
    }

    #[test]
    fn tampered_or_garbled_identities_are_refused() {
        let secret = Secret::new("s");
        let text = sign(&secret, 1000, Some("alice"), None, None);
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
