//! The live entries of this instance, indexed for lookups on every check: CIDRs in a range
//! table, ASNs and exact subjects in maps; what an IP's verdict and a subject's factors get
//! from them.

use std::collections::HashMap;
use std::net::IpAddr;

use super::{Entry, EntryKind, ListName, Lists, list_factors};
use crate::model::{Identifiers, Reason};
use crate::reputation::Verdict;
use crate::reputation::parse::{parse_cidr_or_ip, position};
use crate::reputation::table::RangeTable;
use crate::scoring::{Factor, Signal, Subject};

/// Entries currently in force, indexed for lookups.
#[derive(Debug, Default)]
pub(super) struct Live {
    pub(super) entries: Vec<Entry>,
    cidrs: RangeTable,
    asns: HashMap<u32, Vec<u16>>,
    /// Account and device entries by subject key text (`user:alice`, `device:d1`).
    subjects: HashMap<String, Vec<u16>>,
}

impl Lists {
    /// Live entries of one list.
    pub fn entries(&self, list: ListName) -> Vec<Entry> {
        let now = self.clock.now_ms();
        self.live
            .load()
            .entries
            .iter()
            .filter(|e| e.list == list && e.expires_at_ms.is_none_or(|at| at > now))
            .cloned()
            .collect()
    }

    /// IP, CIDR and ASN entries matching `ip` (of AS `asn`), live at `now_ms`.
    pub fn ip_entries(&self, ip: IpAddr, asn: Option<u32>, now_ms: i64) -> Vec<Entry> {
        let live = self.live.load();
        let mut hits: Vec<&Entry> = live
            .cidrs
            .lookup(position(ip))
            .iter()
            .map(|&i| &live.entries[usize::from(i)])
            .collect();
        if let Some(ids) = asn.and_then(|asn| live.asns.get(&asn)) {
            hits.extend(ids.iter().map(|&i| &live.entries[usize::from(i)]));
        }
        hits.into_iter()
            .filter(|e| e.expires_at_ms.is_none_or(|at| at > now_ms))
            .cloned()
            .collect()
    }

    /// ASN entries for `asn`, live at `now_ms`.
    pub fn asn_entries(&self, asn: u32, now_ms: i64) -> Vec<Entry> {
        let live = self.live.load();
        live.asns
            .get(&asn)
            .into_iter()
            .flatten()
            .map(|&i| &live.entries[usize::from(i)])
            .filter(|e| e.expires_at_ms.is_none_or(|at| at > now_ms))
            .cloned()
            .collect()
    }

    /// Applies the lists to a reputation verdict: deny → multiplier 0 (deny beats allow when
    /// both match); allow → at least 1 over every range class.
    pub fn apply(&self, verdict: &mut Verdict) {
        let live = self.live.load();
        let now = self.clock.now_ms();
        let mut hits: Vec<&Entry> = live
            .cidrs
            .lookup(position(verdict.ip))
            .iter()
            .map(|&i| &live.entries[usize::from(i)])
            .collect();
        if let Some(ids) = verdict.asn.and_then(|asn| live.asns.get(&asn)) {
            hits.extend(ids.iter().map(|&i| &live.entries[usize::from(i)]));
        }
        hits.retain(|e| e.expires_at_ms.is_none_or(|at| at > now));
        for list in [ListName::Allow, ListName::Deny] {
            let matching: Vec<&&Entry> = hits.iter().filter(|e| e.list == list).collect();
            if matching.is_empty() {
                continue;
            }
            verdict.classes.push(list.as_str().to_owned());
            for entry in &matching {
                verdict
                    .sources
                    .push(format!("lists/{}/{}", list.as_str(), entry.id));
            }
            let values: Vec<&str> = matching.iter().map(|e| e.value.as_str()).collect();
            verdict.reasons.push(Reason::new(
                &format!("list_{}", list.as_str()),
                format!("{} list: {}", list.as_str(), values.join(", ")),
            ));
        }
        let denied = hits.iter().any(|e| e.list == ListName::Deny);
        let allowed = hits.iter().any(|e| e.list == ListName::Allow);
        if denied {
            verdict.multiplier = 0.0;
        } else if allowed {
            verdict.multiplier = verdict.multiplier.max(1.0);
        }
        verdict.classes.sort();
        verdict.classes.dedup();
    }
}

impl Live {
    pub(super) fn build(entries: Vec<Entry>, ids: Identifiers) -> Self {
        let mut ranges = Vec::new();
        let mut asns: HashMap<u32, Vec<u16>> = HashMap::new();
        let mut subjects: HashMap<String, Vec<u16>> = HashMap::new();
        for (index, entry) in entries.iter().enumerate() {
            let Ok(index) = u16::try_from(index) else {
                break;
            };
            match entry.kind {
                EntryKind::Cidr => {
                    if let Some((start, end)) = parse_cidr_or_ip(&entry.value) {
                        ranges.push((start, end, index));
                    }
                }
                EntryKind::Asn => {
                    if let Ok(asn) = entry.value.trim_start_matches("AS").parse::<u32>() {
                        asns.entry(asn).or_default().push(index);
                    }
                }
                EntryKind::Account | EntryKind::Device => {
                    let key = if entry.kind == EntryKind::Account {
                        ids.user_key("value", &entry.value)
                    } else {
                        ids.device_key(&entry.value)
                    };
                    if let Ok(key) = key {
                        subjects.entry(key.to_string()).or_default().push(index);
                    }
                }
            }
        }
        Live {
            cidrs: RangeTable::build(ranges),
            entries,
            asns,
            subjects,
        }
    }
}

/// Account and device entries as a pull signal (IP, CIDR and ASN entries reach scoring
/// through the reputation verdict, see [`super::signal`]).
impl Signal for Lists {
    fn name(&self) -> &'static str {
        "lists"
    }

    fn factors(&self, subject: &Subject<'_>, stored: &[Factor], now_ms: i64) -> Vec<Factor> {
        // Entries naming this subject exactly are stored too (see `announce`).
        if stored.iter().any(|f| f.signal == "lists") {
            return Vec::new();
        }
        let live = self.live.load();
        let Some(indices) = live.subjects.get(subject.key.as_str()) else {
            return Vec::new();
        };
        let hits: Vec<&Entry> = indices
            .iter()
            .map(|&i| &live.entries[usize::from(i)])
            .filter(|e| e.expires_at_ms.is_none_or(|at| at > now_ms))
            .collect();
        list_factors(&hits)
    }
}
