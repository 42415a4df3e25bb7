//! IP and ASN reputation: range sources, ASN databases, one immutable lookup table, hot reload.
//!
//! Owns loading the data dir (`ranges/<class>/*`, `asns/<class>.txt`, `asn/*.mmdb`,
//! `asn/*.csv`), the parsers ([`parse`]), the [`table::RangeTable`] and the swap. Read
//! [`Reputation::lookup`] first. A broken file is named with its line, and the old
//! snapshot stays in force.

pub mod dates;
pub mod lists;
mod load; // reading the data dir into a snapshot
mod locate;
pub use load::{load, load_with};
pub use locate::locate;
pub mod parse;
pub mod signal;
pub mod table;
pub mod update;

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::clock::Clock;
use crate::config::ReputationSettings;
use crate::model::Reason;
use table::RangeTable;

/// A file that could not be loaded: which, where, why.
#[derive(Debug, Clone, thiserror::Error, Serialize)]
#[error("{file}: line {line}: {reason}")]
pub struct LoadError {
    /// Path relative to the data dir.
    pub file: String,
    /// 1-based line (0: the whole file).
    pub line: usize,
    /// Why.
    pub reason: String,
}

/// One loaded source.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Source {
    /// Path relative to the data dir, e.g. `ranges/tor/exits.csv`.
    pub file: String,
    /// Class it assigns.
    pub class: String,
    /// Ranges (or ASNs) read.
    pub entries: usize,
    /// When the file was last written, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_ms: Option<i64>,
    /// The data's own date, Unix ms (its age is reported at start and reload): the
    /// publisher's timestamp, the snapshot in `SOURCES.md`, else the modification time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dated_ms: Option<i64>,
    /// Where `dated_ms` came from.
    pub dated_by: dates::DatedBy,
}

/// A source older than this is reported as stale.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// The classes a data dir is expected to fill (the shipped lists fill all four).
pub const EXPECTED_CLASSES: &[&str] = &["datacenter", "vpn", "proxy", "tor"];

/// One line of the data report: a warning or not, and the text.
pub type ReportLine = (bool, String);

/// IP→ASN ranges from a CSV (`start,end,asn,org`), sorted by start.
#[derive(Debug, Default)]
struct AsnRanges {
    v4_index: table::V4Index,
    starts: Vec<u128>,
    ends: Vec<u128>,
    asns: Vec<u32>,
    orgs: Vec<Arc<str>>,
}

impl AsnRanges {
    /// The index of the range covering `position` (IPv4 searches one /16 of the starts).
    fn lookup(&self, position: u128) -> Option<usize> {
        let i = self
            .v4_index
            .starts_at_or_before(&self.starts, position)
            .checked_sub(1)?;
        (position <= self.ends[i]).then_some(i)
    }
}

/// Everything loaded from the data dir at one time.
#[derive(Debug, Default)]
pub struct Snapshot {
    table: RangeTable,
    sources: Vec<Source>,
    mmdbs: Vec<maxminddb::Reader<Vec<u8>>>,
    asn_ranges: AsnRanges,
    asn_classes: HashMap<u32, Vec<u16>>,
    /// Ranges read over all range sources.
    pub ranges: usize,
}

impl Snapshot {
    /// Number of disjoint segments in the lookup table.
    pub fn segments(&self) -> usize {
        self.table.segments()
    }

    /// The sources.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// One line per source (entries, age), and warnings for a source older than
    /// [`STALE_AFTER`] and for an expected class with no entries.
    pub fn report(&self, now_ms: i64) -> Vec<ReportLine> {
        let mut lines = Vec::new();
        for source in &self.sources {
            let age = std::time::Duration::from_millis(
                source
                    .dated_ms
                    .and_then(|m| u64::try_from(now_ms.saturating_sub(m)).ok())
                    .unwrap_or(0),
            );
            let days = age.as_secs() / 86_400;
            lines.push((
                false,
                format!(
                    "reputation source {} ({}): {} entries, {days} days old ({})",
                    source.file,
                    source.class,
                    source.entries,
                    match source.dated_by {
                        dates::DatedBy::Published => "dated by its publisher",
                        dates::DatedBy::SourcesMd => "dated by SOURCES.md",
                        dates::DatedBy::Modified => "dated by the file's modification time",
                    }
                ),
            ));
            if age > STALE_AFTER {
                lines.push((
                    true,
                    format!(
                        "reputation source {} is {days} days old: run `palisade ranges update`",
                        source.file
                    ),
                ));
            }
        }
        for class in EXPECTED_CLASSES {
            let entries: usize = self
                .sources
                .iter()
                .filter(|s| s.class == *class)
                .map(|s| s.entries)
                .sum();
            if entries == 0 {
                lines.push((
                    true,
                    format!("reputation class {class} is empty: its addresses are not recognised"),
                ));
            }
        }
        lines
    }

    /// ASN databases (mmdb files) and IP→ASN ranges loaded.
    pub fn asn_databases(&self) -> (usize, usize) {
        (self.mmdbs.len(), self.asn_ranges.starts.len())
    }
}

/// The reputation of one IP.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The address as normalised (IPv4-mapped IPv6 → IPv4).
    pub ip: IpAddr,
    /// Autonomous system, if an ASN source knows it.
    pub asn: Option<u32>,
    /// Its organisation.
    pub as_org: Option<String>,
    /// Classes, sorted, unique.
    pub classes: Vec<String>,
    /// Every source that lists it (range files by address, ASN lists by its ASN).
    pub sources: Vec<String>,
    /// The strictest class factor (1.0 when clean).
    pub multiplier: f64,
    /// One reason per class.
    pub reasons: Vec<Reason>,
}

impl Snapshot {
    /// Classes the ASN lists (`asns/<class>.txt`) give `asn`, with their source files.
    pub fn asn_classes(&self, asn: u32) -> Vec<(&str, &str)> {
        self.asn_classes
            .get(&asn)
            .into_iter()
            .flatten()
            .map(|&id| {
                let source = &self.sources[usize::from(id)];
                (source.class.as_str(), source.file.as_str())
            })
            .collect()
    }

    /// The ASN and organisation of `ip` (from the mmdb files first, then the ASN ranges).
    pub fn asn(&self, ip: IpAddr) -> Option<(u32, String)> {
        let ip = unmapped(ip);
        self.asn_of(ip, parse::position(ip))
            .map(|(asn, org)| (asn, org.to_owned()))
    }

    /// The ASN of `ip` alone, as [`Snapshot::asn`] finds it, without copying the
    /// organisation's name (what scoring asks on every request).
    pub fn asn_number(&self, ip: IpAddr) -> Option<u32> {
        let ip = unmapped(ip);
        self.asn_of(ip, parse::position(ip)).map(|(asn, _)| asn)
    }

    /// The ASN and organisation of `ip` (unmapped, at `position`), borrowed from the data.
    fn asn_of(&self, ip: IpAddr, position: u128) -> Option<(u32, &str)> {
        for reader in &self.mmdbs {
            if let Ok(result) = reader.lookup(ip)
                && let Ok(Some(asn)) = result.decode::<maxminddb::geoip2::Asn<'_>>()
                && let Some(number) = asn.autonomous_system_number
            {
                return Some((number, asn.autonomous_system_organization.unwrap_or("")));
            }
        }
        self.asn_ranges
            .lookup(position)
            .map(|i| (self.asn_ranges.asns[i], &*self.asn_ranges.orgs[i]))
    }

    /// All classes, sources and the ASN of one address; `factors` weighs the classes.
    pub fn lookup(&self, ip: IpAddr, factors: &ReputationSettings) -> Verdict {
        let ip = unmapped(ip);
        let position = parse::position(ip);
        let mut hits: Vec<u16> = self.table.lookup(position).to_vec();
        let asn = self.asn_of(ip, position);
        if let Some(ids) = asn
            .as_ref()
            .and_then(|(number, _)| self.asn_classes.get(number))
        {
            hits.extend(ids);
        }
        let mut classes = BTreeSet::new();
        let mut sources = Vec::new();
        for id in hits {
            let source = &self.sources[usize::from(id)];
            classes.insert(source.class.clone());
            sources.push(source.file.clone());
        }
        let reasons = classes
            .iter()
            .map(|class| {
                let listed_by: Vec<&str> = self
                    .sources
                    .iter()
                    .filter(|s| &s.class == class && sources.contains(&s.file))
                    .map(|s| s.file.as_str())
                    .collect();
                Reason::new(
                    &format!("reputation_{class}"),
                    format!(
                        "{class} (factor {}): {}",
                        factors.factor(class),
                        listed_by.join(", ")
                    ),
                )
            })
            .collect();
        let multiplier = classes
            .iter()
            .map(|c| factors.factor(c))
            .fold(1.0, f64::min);
        Verdict {
            ip,
            asn: asn.as_ref().map(|(n, _)| *n),
            as_org: asn.map(|(_, org)| org.to_owned()).filter(|o| !o.is_empty()),
            classes: classes.into_iter().collect(),
            sources,
            multiplier,
            reasons,
        }
    }
}

/// `ip` with an IPv4-mapped IPv6 address as the IPv4 address it maps.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The reputation service: the current snapshot, swapped atomically on reload.
#[derive(Debug)]
pub struct Reputation {
    data_dir: PathBuf,
    factors: ReputationSettings,
    current: ArcSwap<Snapshot>,
    /// Dates the report of each load (a source's age).
    clock: Arc<dyn Clock>,
}

impl Reputation {
    /// Loads the data dir (a broken file stops the start with its name and line).
    pub fn open(
        data_dir: &Path,
        factors: ReputationSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LoadError> {
        let snapshot = load_with(data_dir, &factors.sources)?;
        log_report(&snapshot, clock.now_ms());
        Ok(Self {
            data_dir: data_dir.to_owned(),
            factors,
            current: ArcSwap::from_pointee(snapshot),
            clock,
        })
    }

    /// The reputation of `ip` in the current snapshot (lock-free read).
    pub fn lookup(&self, ip: IpAddr) -> Verdict {
        self.current.load().lookup(ip, &self.factors)
    }

    /// The ASN of `ip`, without the rest of a verdict.
    pub fn asn(&self, ip: IpAddr) -> Option<u32> {
        self.current.load().asn_number(ip)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Re-reads the data dir off the request path and swaps the new snapshot in atomically;
    /// on error the old one stays and the error names the file and line.
    pub async fn reload(&self) -> Result<Arc<Snapshot>, LoadError> {
        let dir = self.data_dir.clone();
        let sources = self.factors.sources.clone();
        let snapshot = tokio::task::spawn_blocking(move || load_with(&dir, &sources))
            .await
            .map_err(|e| LoadError {
                file: String::new(),
                line: 0,
                reason: format!("loader failed: {e}"),
            })??;
        let snapshot = Arc::new(snapshot);
        log_report(&snapshot, self.clock.now_ms());
        self.current.store(snapshot.clone());
        tracing::info!(
            reputation.sources = snapshot.sources.len(),
            reputation.ranges = snapshot.ranges,
            "reloaded reputation data: {} sources, {} ranges",
            snapshot.sources.len(),
            snapshot.ranges
        );
        Ok(snapshot)
    }
}

fn log_report(snapshot: &Snapshot, now_ms: i64) {
    for (warning, line) in snapshot.report(now_ms) {
        if warning {
            tracing::warn!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }
}

impl crate::scoring::AsnLookup for Reputation {
    fn asn(&self, ip: IpAddr) -> Option<u32> {
        Reputation::asn(self, ip)
    }
}

#[cfg(test)]
mod report_tests {
    use super::*;

    /// Each source is reported with its entries and age; a stale source and an empty
    /// expected class are warnings.
    #[test]
    fn the_report_names_sources_ages_and_gaps() {
        let dir = tempfile::tempdir().unwrap();
        for (class, body) in [("datacenter", "10.0.0.0/8\n"), ("tor", "192.0.2.1\n")] {
            std::fs::create_dir_all(dir.path().join("ranges").join(class)).unwrap();
            std::fs::write(dir.path().join("ranges").join(class).join("list.txt"), body).unwrap();
        }
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(40 * 86_400);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("ranges/tor/list.txt"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let snapshot = load(dir.path()).unwrap();
        let now_ms = chrono::Utc::now().timestamp_millis();
        let report = snapshot.report(now_ms);
        let text = |warning: bool| -> Vec<&str> {
            report
                .iter()
                .filter(|(w, _)| *w == warning)
                .map(|(_, l)| l.as_str())
                .collect()
        };
        assert!(
            text(false).contains(
                &"reputation source ranges/datacenter/list.txt (datacenter): 1 entries, 0 days old (dated by the file's modification time)"
            ),
            "{report:?}"
        );
        assert!(
            text(false)
                .iter()
                .any(|l| l.contains("ranges/tor/list.txt (tor): 1 entries, 40 days old"))
        );
        let warnings = text(true);
        assert!(
            warnings
                .iter()
                .any(|l| l.contains("ranges/tor/list.txt is 40 days old")),
            "{warnings:?}"
        );
        assert!(
            warnings.contains(&"reputation class vpn is empty: its addresses are not recognised")
        );
        assert!(
            warnings.contains(&"reputation class proxy is empty: its addresses are not recognised")
        );
        assert!(
            !warnings
                .iter()
                .any(|l| l.contains("class datacenter") || l.contains("class tor"))
        );
        // The shipped data fills every expected class, and its ages are the data's: the
        // Tor list of 2024-02 is stale whatever the files' modification times say, AWS's
        // ranges carry their publisher's date.
        let shipped = load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data")).unwrap();
        let today = chrono::NaiveDate::from_ymd_opt(2026, 12, 6)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp_millis();
        let shipped_report = shipped.report(today);
        assert!(
            shipped_report.iter().any(|(warning, line)| *warning
                && line.contains("ranges/tor/tor-exit-nodes-2024-02.lst.gz is 1013 days old")),
            "{shipped_report:?}"
        );
        let aws = shipped
            .sources()
            .iter()
            .find(|s| s.file.ends_with("aws-ip-ranges.json.gz"))
            .unwrap();
        assert_eq!(aws.dated_by, dates::DatedBy::Published);
        let gaps: Vec<String> = shipped
            .report(now_ms)
            .into_iter()
            .filter(|(w, l)| *w && l.contains("is empty"))
            .map(|(_, l)| l)
            .collect();
        assert!(gaps.is_empty(), "{gaps:?}");
    }
}
