//! Range-file parsers; the format is detected from the content.
//!
//! Accepted: one IP or CIDR per line (`#` comments, blank lines); CSV with a CIDR column, or
//! start and end IP columns, or an IP column anywhere (Tor's `fingerprint, ipaddr, port`);
//! AWS `ip-ranges.json`; Google `cloud.json` / `goog.json`; proxy lists
//! (`scheme://host:port`). ASN lists: `AS123`, `123`, `AS123 # comment`, `AS123 name`, or CSV
//! with the number first (`ASN,Entity`). Every error names the line.

use std::net::IpAddr;

/// An inclusive range in one address space: IPv4 is mapped into `::ffff:0:0/96`.
pub type Range = (u128, u128);

/// A line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct LineError {
    /// 1-based line number (0 for a whole-file problem such as bad JSON).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// The 128-bit position of an address (IPv4 mapped, so both families share one table).
pub fn position(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(u128::from(v6), |v4| u128::from(v4.to_ipv6_mapped())),
    }
}

/// Parses `1.2.3.4`, `1.2.3.0/24`, `2001:db8::/32` into a range.
pub fn parse_cidr_or_ip(text: &str) -> Option<Range> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        let p = position(ip);
        return Some((p, p));
    }
    let (addr, len) = text.split_once('/')?;
    let ip: IpAddr = addr.trim().parse().ok()?;
    let len: u32 = len.trim().parse().ok()?;
    let (bits, len) = match ip {
        IpAddr::V4(_) if len <= 32 => (position(ip), len + 96),
        IpAddr::V6(_) if len <= 128 => (position(ip), len),
        _ => return None,
    };
    let host_bits = 128 - len;
    let mask = if host_bits == 128 {
        0
    } else {
        u128::MAX << host_bits
    };
    let start = bits & mask;
    Some((start, start | !mask))
}

fn strip_comment(line: &str) -> &str {
    line.split('#').next().unwrap_or("").trim()
}

/// Detects the format and parses every range of a range file.
pub fn parse_ranges(text: &str) -> Result<Vec<Range>, LineError> {
    parse_ranges_as(text, RangeFormat::Auto)
}

/// Parses a range file in a given format; `Auto` detects it from the content. With an
/// explicit format, a line of another format is an error naming the expected one.
pub fn parse_ranges_as(text: &str, format: RangeFormat) -> Result<Vec<Range>, LineError> {
    let trimmed = text.trim_start();
    if format == RangeFormat::Json || (format == RangeFormat::Auto && trimmed.starts_with('{')) {
        return parse_cloud_json(text);
    }
    let refuse = |line_no: usize, line: &str| LineError {
        line: line_no,
        reason: format!("{line:.60?} is not a {} line", format.as_str()),
    };
    let mut ranges = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = strip_comment(raw);
        if line.is_empty() {
            continue;
        }
        let allows = |f: RangeFormat| format == RangeFormat::Auto || format == f;
        if allows(RangeFormat::Cidr)
            && let Some(range) = parse_cidr_or_ip(line)
        {
            ranges.push(range);
            continue;
        }
        if allows(RangeFormat::Csv) && line.contains(',') {
            match parse_csv_line(line) {
                Some(range) => ranges.push(range),
                // A header line (first line, no address in it) is skipped.
                None if index == 0 => {}
                None => {
                    return Err(LineError {
                        line: line_no,
                        reason: format!("no IP, CIDR or start,end range in {:.60?}", line),
                    });
                }
            }
            continue;
        }
        if allows(RangeFormat::Urls)
            && let Some((_, rest)) = line.split_once("://")
        {
            let host = rest
                .rsplit_once(':')
                .map_or(rest, |(h, _)| h)
                .trim_matches(['[', ']']);
            match host.parse::<IpAddr>() {
                Ok(ip) => ranges.push((position(ip), position(ip))),
                Err(_) => {
                    return Err(LineError {
                        line: line_no,
                        reason: format!("{host:?} is not an IP address"),
                    });
                }
            }
            continue;
        }
        if format != RangeFormat::Auto {
            return Err(refuse(line_no, line));
        }
        return Err(LineError {
            line: line_no,
            reason: format!("{line:.60?} is not an IP address or CIDR"),
        });
    }
    Ok(ranges)
}

pub use crate::config::RangeFormat;

/// CSV: a CIDR in the first column; or start,end IPs in the first two; or an IP in any column.
fn parse_csv_line(line: &str) -> Option<Range> {
    let columns: Vec<&str> = line
        .split(',')
        .map(|c| c.trim().trim_matches('"'))
        .collect();
    let first = columns.first()?;
    if first.contains('/') {
        return parse_cidr_or_ip(first);
    }
    let ip = |text: &str| text.parse::<IpAddr>().ok().map(position);
    if let (Some(start), Some(end)) = (ip(first), columns.get(1).and_then(|c| ip(c))) {
        return (start <= end).then_some((start, end));
    }
    columns.iter().find_map(|c| ip(c)).map(|p| (p, p))
}

fn parse_cloud_json(text: &str) -> Result<Vec<Range>, LineError> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| LineError {
        line: e.line(),
        reason: format!("invalid JSON: {e}"),
    })?;
    let mut ranges = Vec::new();
    for list in ["prefixes", "ipv6_prefixes"] {
        let Some(items) = doc.get(list).and_then(|v| v.as_array()) else {
            continue;
        };
        for (i, item) in items.iter().enumerate() {
            let prefix = ["ip_prefix", "ipv6_prefix", "ipv4Prefix", "ipv6Prefix"]
                .iter()
                .find_map(|k| item.get(*k).and_then(|v| v.as_str()));
            match prefix.and_then(parse_cidr_or_ip) {
                Some(range) => ranges.push(range),
                None => {
                    return Err(LineError {
                        line: 0,
                        reason: format!("{list}[{i}] has no valid ip_prefix/ipv4Prefix/ipv6Prefix"),
                    });
                }
            }
        }
    }
    if ranges.is_empty() && doc.get("prefixes").is_none() {
        return Err(LineError {
            line: 0,
            reason: "JSON without `prefixes`: not an AWS ip-ranges.json or Google cloud.json"
                .to_owned(),
        });
    }
    Ok(ranges)
}

/// Parses an ASN list.
pub fn parse_asns(text: &str) -> Result<Vec<u32>, LineError> {
    let mut asns = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = strip_comment(raw);
        if line.is_empty() {
            continue;
        }
        let token = line
            .split([',', ' ', '\t'])
            .next()
            .unwrap_or("")
            .trim()
            .trim_matches('"');
        let digits = token
            .strip_prefix("AS")
            .or_else(|| token.strip_prefix("as"))
            .unwrap_or(token);
        match digits.parse::<u32>() {
            Ok(asn) => asns.push(asn),
            Err(_) if index == 0 => {} // a header such as `ASN,Entity`
            Err(_) => {
                return Err(LineError {
                    line: index + 1,
                    reason: format!("{token:.30?} is not an AS number"),
                });
            }
        }
    }
    Ok(asns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_format_is_detected() {
        let text = "# comment\n\n10.0.0.0/8\n192.0.2.1\n2001:db8::/32 # inline\n";
        assert_eq!(parse_ranges(text).unwrap().len(), 3);
        let csv = "3.0.0.0,3.1.255.255,Amazon AWS,http://aws\n";
        let r = parse_ranges(csv).unwrap();
        assert_eq!(r[0].1 - r[0].0 + 1, 2 * 65536);
        let tor = "fingerprint, ipaddr, port\nABC, 204.8.96.141, 444\nDEF, 2620:7:6003::141, 81\n";
        assert_eq!(parse_ranges(tor).unwrap().len(), 2);
        let proxies = "socks4://144.31.222.106:7890\nhttp://85.8.47.198:7080";
        let csv_with_url = "3.0.0.0,3.1.255.255,Amazon AWS,http://www.amazon.com/aws/\n";
        assert_eq!(parse_ranges(csv_with_url).unwrap().len(), 1);
        assert_eq!(parse_ranges(proxies).unwrap().len(), 2);
        let aws = r#"{"prefixes":[{"ip_prefix":"3.5.140.0/22"}],"ipv6_prefixes":[{"ipv6_prefix":"2600:1f14::/35"}]}"#;
        assert_eq!(parse_ranges(aws).unwrap().len(), 2);
    }

    #[test]
    fn malformed_lines_are_reported_with_their_number() {
        let err = parse_ranges("10.0.0.0/8\n10.0.0.0/33\n").unwrap_err();
        assert_eq!(err.line, 2);
        let err = parse_ranges("1.1.1.1\nnot an ip\n").unwrap_err();
        assert_eq!(err.line, 2);
        // An explicit format refuses the others' lines, naming the line.
        let err = parse_ranges_as("10.0.0.0/8\n1.2.3.4,5.6.7.8\n", RangeFormat::Cidr).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.reason.contains("cidr"), "{}", err.reason);
        assert!(parse_ranges_as("1.2.3.4,5.6.7.8\n", RangeFormat::Csv).is_ok());
        assert!(parse_ranges_as("10.0.0.0/8\n", RangeFormat::Json).is_err());
        assert_eq!(
            parse_ranges_as("socks5://1.2.3.4:1080\n", RangeFormat::Urls)
                .unwrap()
                .len(),
            1
        );
        let err = parse_asns("AS1\nASX\n").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(parse_ranges("{\"prefixes\": [").is_err());
    }

    #[test]
    fn ipv4_mapped_ipv6_is_the_same_position_as_ipv4() {
        let v4 = position("192.0.2.1".parse().unwrap());
        let mapped = position("::ffff:192.0.2.1".parse().unwrap());
        assert_eq!(v4, mapped);
        assert_eq!(
            parse_cidr_or_ip("192.0.2.0/24").unwrap(),
            (v4 - 1, v4 + 254)
        );
    }

    #[test]
    fn asn_lists_in_every_shape() {
        let text = "ASN,Entity\n198375,\"INULOGIC\"\n51447, \"RootLayer\"\nAS45090 # Tencent\nAS3223 VOXILITY\n";
        assert_eq!(parse_asns(text).unwrap(), vec![198375, 51447, 45090, 3223]);
    }
}
