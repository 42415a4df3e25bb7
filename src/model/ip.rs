//! A client address as budgets key it: IPv4, or an IPv6 prefix.

use std::net::{IpAddr, Ipv6Addr};

/// A client address, normalised: IPv4-mapped IPv6 becomes IPv4, and IPv6 is keyed by its
/// prefix (default /64) so one host cannot rotate through its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIp {
    addr: IpAddr,
    ipv6_prefix_len: u8,
}

impl ClientIp {
    /// Normalises `addr`; `ipv6_prefix_len` is 32..=128.
    pub fn new(addr: IpAddr, ipv6_prefix_len: u8) -> Self {
        let addr = match addr {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        Self {
            addr,
            ipv6_prefix_len: ipv6_prefix_len.clamp(1, 128),
        }
    }

    /// Parses text (IPv4, IPv6, IPv4-mapped IPv6).
    pub fn parse(text: &str, ipv6_prefix_len: u8) -> Option<Self> {
        text.trim()
            .parse::<IpAddr>()
            .ok()
            .map(|addr| Self::new(addr, ipv6_prefix_len))
    }

    /// The (normalised) address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length IPv6 clients are keyed by.
    pub fn ipv6_prefix_len(&self) -> u8 {
        self.ipv6_prefix_len
    }

    /// The network a household or a carrier's pool shares: an IPv4 address's /24, an IPv6
    /// address's /64 (`net:203.0.113.0/24`, `net:2001:db8:1:2::/64`). A login from one
    /// address of it makes the others familiar to the account (the lockout-DoS rule).
    pub fn network_text(&self) -> String {
        match self.addr {
            IpAddr::V4(v4) => {
                let [a, b, c, _] = v4.octets();
                format!("net:{a}.{b}.{c}.0/24")
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & (u128::MAX << 64);
                format!("net:{}/64", Ipv6Addr::from(bits))
            }
        }
    }

    /// Appends the key text: the address, or an IPv6 client's prefix (`2001:db8::/64`),
    /// spelled as `Display` spells it, without going through `fmt` (every check keys its
    /// client; a unit test compares the two).
    pub(super) fn write_key(&self, out: &mut String) {
        match self.addr {
            IpAddr::V4(v4) => write_ipv4(out, v4),
            IpAddr::V6(v6) if self.ipv6_prefix_len >= 128 => write_ipv6(out, v6),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = u128::MAX << (128 - u32::from(self.ipv6_prefix_len));
                write_ipv6(out, Ipv6Addr::from(bits & mask));
                out.push('/');
                write_decimal(out, u16::from(self.ipv6_prefix_len));
            }
        }
    }
}

fn write_decimal(out: &mut String, n: u16) {
    let mut digits = [0u8; 5];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// `a.b.c.d`, as `Ipv4Addr`'s `Display`.
fn write_ipv4(out: &mut String, addr: std::net::Ipv4Addr) {
    for (i, octet) in addr.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        write_decimal(out, u16::from(octet));
    }
}

/// RFC 5952 text, as `Ipv6Addr`'s `Display`: lower-case hex without leading zeros, the
/// longest run of two or more zero groups (the first of equal runs) as `::`. An
/// IPv4-mapped address goes through `Display` (`::ffff:a.b.c.d`).
fn write_ipv6(out: &mut String, addr: Ipv6Addr) {
    let groups = addr.segments();
    if groups[..5] == [0; 5] && groups[5] == 0xffff {
        use std::fmt::Write;
        let _ = write!(out, "{addr}");
        return;
    }
    let (mut best, mut best_len, mut run, mut run_len) = (0, 0, 0, 0);
    for (i, &g) in groups.iter().enumerate() {
        if g == 0 {
            if run_len == 0 {
                run = i;
            }
            run_len += 1;
            if run_len > best_len {
                (best, best_len) = (run, run_len);
            }
        } else {
            run_len = 0;
        }
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let group = |out: &mut String, g: u16| {
        let mut started = false;
        for shift in [12, 8, 4, 0] {
            let nibble = usize::from((g >> shift) & 0xf);
            if started || nibble != 0 || shift == 0 {
                out.push(char::from(HEX[nibble]));
                started = true;
            }
        }
    };
    let mut i = 0;
    while i < 8 {
        if best_len >= 2 && i == best {
            out.push_str("::");
            i += best_len;
            continue;
        }
        if i > 0 && !(best_len >= 2 && i == best + best_len) {
            out.push(':');
        }
        group(out, groups[i]);
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SubjectKey;

    #[test]
    fn ip_keys_are_spelled_as_display_spells_them() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in 0..20_000 {
            // Groups zero often, so every shape of zero runs is met.
            let groups: [u16; 8] = std::array::from_fn(|_| match rng.random_range(0..4) {
                0 | 1 => 0,
                2 => rng.random_range(0..16),
                _ => rng.random(),
            });
            let v6 = Ipv6Addr::from(groups);
            let mut text = String::new();
            write_ipv6(&mut text, v6);
            assert_eq!(text, v6.to_string(), "{groups:?}");
            let v4 = std::net::Ipv4Addr::from(rng.random::<u32>() >> (n % 32));
            let mut text = String::new();
            write_ipv4(&mut text, v4);
            assert_eq!(text, v4.to_string());
            let prefix = rng.random_range(1..=128);
            let client = ClientIp::new(IpAddr::V6(v6), prefix);
            let mut key = String::new();
            client.write_key(&mut key);
            let expected = match client.addr() {
                IpAddr::V6(a) if prefix < 128 => format!(
                    "{}/{prefix}",
                    Ipv6Addr::from(u128::from(a) & (u128::MAX << (128 - u32::from(prefix))))
                ),
                other => other.to_string(),
            };
            assert_eq!(key, expected);
        }
        for mapped in [
            "::ffff:1.2.3.4",
            "::1",
            "::",
            "1::",
            "1:0:0:1:0:0:0:1",
            "0:0:1::",
        ] {
            let v6: Ipv6Addr = mapped.parse().unwrap();
            let mut text = String::new();
            write_ipv6(&mut text, v6);
            assert_eq!(text, v6.to_string());
        }
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_prefix() {
        let a = ClientIp::parse("2001:db8:1:2:aaaa::1", 64).unwrap();
        let b = ClientIp::parse("2001:db8:1:2:bbbb::9", 64).unwrap();
        assert_eq!(SubjectKey::ip(&a), SubjectKey::ip(&b));
        assert_eq!(SubjectKey::ip(&a).to_string(), "ip:2001:db8:1:2::/64");
        let other = ClientIp::parse("2001:db8:1:3::1", 64).unwrap();
        assert_ne!(SubjectKey::ip(&a), SubjectKey::ip(&other));
    }

    #[test]
    fn networks_are_the_slash_24_and_the_slash_64() {
        let v4 = ClientIp::parse("203.0.113.77", 64).unwrap();
        assert_eq!(v4.network_text(), "net:203.0.113.0/24");
        let v6 = ClientIp::parse("2001:db8:1:2:aaaa::1", 128).unwrap();
        assert_eq!(v6.network_text(), "net:2001:db8:1:2::/64");
    }

    #[test]
    fn ipv4_mapped_ipv6_is_the_ipv4_address() {
        let mapped = ClientIp::parse("::ffff:203.0.113.7", 64).unwrap();
        assert_eq!(SubjectKey::ip(&mapped).to_string(), "ip:203.0.113.7");
    }
}
