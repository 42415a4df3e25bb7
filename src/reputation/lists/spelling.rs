//! An entry's spelling: its value made canonical (a CIDR as its prefix, `AS123`, an account
//! or device as every other entry point spells it), the subject it maps to exactly, and
//! which ranges are too broad to list without `force`.

use std::net::IpAddr;

use super::{Entry, EntryKind, Error, Lists};
use crate::model::{ClientIp, SubjectKey};
use crate::reputation::parse::parse_cidr_or_ip;

/// True for a normalised CIDR broader than /8 (IPv4) or /16 (IPv6).
///
/// Allowing such a range lifts penalties, denying it refuses, for a large part of the
/// internet: it needs `force` from an admin, and a deny entry this broad is never published
/// to bouncers or edge exports (a firewall would drop everyone).
pub fn too_broad(cidr: &str) -> bool {
    let Some((ip, len)) = cidr.split_once('/') else {
        return false;
    };
    let Ok(len) = len.parse::<u8>() else {
        return false;
    };
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => len < 8,
        Ok(IpAddr::V6(_)) => len < 16,
        Err(_) => false,
    }
}

impl Lists {
    /// Normalises a value and infers its kind: IPs/CIDRs → `cidr`, `AS123` → `asn`;
    /// accounts and devices need `kind`.
    pub fn normalize(
        &self,
        value: &str,
        kind: Option<EntryKind>,
    ) -> Result<(EntryKind, String), Error> {
        let value = value.trim();
        let inferred = kind.or_else(|| {
            if parse_cidr_or_ip(value).is_some() {
                Some(EntryKind::Cidr)
            } else if value
                .strip_prefix("AS")
                .or_else(|| value.strip_prefix("as"))
                .is_some_and(|d| d.parse::<u32>().is_ok())
            {
                Some(EntryKind::Asn)
            } else {
                None
            }
        });
        let kind = inferred.ok_or_else(|| {
            Error::Invalid(format!(
                "cannot infer the kind of {value:.64?}: give kind = account or device"
            ))
        })?;
        let normalized = match kind {
            EntryKind::Cidr => {
                let (start, end) = parse_cidr_or_ip(value)
                    .ok_or_else(|| Error::Invalid(format!("{value:.64?} is not an IP or CIDR")))?;
                canonical_cidr(start, end)
            }
            EntryKind::Asn => {
                let digits = value
                    .strip_prefix("AS")
                    .or_else(|| value.strip_prefix("as"))
                    .unwrap_or(value);
                let asn: u32 = digits
                    .parse()
                    .map_err(|_| Error::Invalid(format!("{value:.32?} is not an AS number")))?;
                format!("AS{asn}")
            }
            // The canonical id, as every other entry point makes it.
            EntryKind::Account => self
                .ids
                .account("value", value)
                .map_err(|e| Error::Invalid(format!("account {e}")))?
                .into_owned(),
            EntryKind::Device => self
                .ids
                .device(value)
                .map_err(|e| Error::Invalid(e.to_string()))?
                .to_owned(),
        };
        Ok((kind, normalized))
    }

    /// The limiter subject an entry maps to exactly, if any (then it is stored as the
    /// subject's factor, shared by every instance at once).
    pub fn subject(&self, entry: &Entry) -> Option<SubjectKey> {
        match entry.kind {
            EntryKind::Account => self.ids.user_key("value", &entry.value).ok(),
            EntryKind::Device => self.ids.device_key(&entry.value).ok(),
            EntryKind::Asn => None,
            EntryKind::Cidr => {
                let (ip, len) = entry.value.split_once('/')?;
                let ip: IpAddr = ip.parse().ok()?;
                let len: u8 = len.parse().ok()?;
                let single = match ip {
                    IpAddr::V4(_) => len == 32,
                    IpAddr::V6(_) => len == self.ipv6_prefix_len,
                };
                single.then(|| SubjectKey::ip(&ClientIp::new(ip, self.ipv6_prefix_len)))
            }
        }
    }
}

/// `start..=end` as text: `a.b.c.d/n` (IPv4) or `x::/n` when it is one prefix.
fn canonical_cidr(start: u128, end: u128) -> String {
    // A prefix range holds 2^host_bits addresses.
    let size = end - start;
    let host_bits = if size == u128::MAX {
        128
    } else {
        (size + 1).trailing_zeros()
    };
    let prefix = 128 - host_bits;
    let v6 = std::net::Ipv6Addr::from(start);
    match v6.to_ipv4_mapped() {
        Some(v4) if prefix >= 96 => format!("{v4}/{}", prefix - 96),
        _ => format!("{v6}/{prefix}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_cidrs() {
        let (s, e) = parse_cidr_or_ip("192.0.2.7").unwrap();
        assert_eq!(canonical_cidr(s, e), "192.0.2.7/32");
        let (s, e) = parse_cidr_or_ip("10.1.2.3/8").unwrap();
        assert_eq!(canonical_cidr(s, e), "10.0.0.0/8");
        let (s, e) = parse_cidr_or_ip("2001:db8::1/64").unwrap();
        assert_eq!(canonical_cidr(s, e), "2001:db8::/64");
        let (s, e) = parse_cidr_or_ip("::ffff:198.51.100.1").unwrap();
        assert_eq!(canonical_cidr(s, e), "198.51.100.1/32");
    }
}
