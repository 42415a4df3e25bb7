//! Reading the data dir into a [`Snapshot`]: range files by class, ASN lists, MaxMind and CSV
//! ASN databases, each source dated; a broken file is named with its line.

use std::path::{Path, PathBuf};

use std::net::IpAddr;
use std::sync::Arc;

use super::table::{self, RangeTable};
use super::{LoadError, Snapshot, Source, dates, parse};

fn relative(dir: &Path, path: &Path) -> String {
    path.strip_prefix(dir).unwrap_or(path).display().to_string()
}

/// A file's text; a `*.gz` file is decompressed first (the lists shipped in `data/` are).
fn read(dir: &Path, path: &Path) -> Result<String, LoadError> {
    let failed = |e: std::io::Error| LoadError {
        file: relative(dir, path),
        line: 0,
        reason: e.to_string(),
    };
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
    {
        let file = std::fs::File::open(path).map_err(failed)?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(file), &mut text)
            .map_err(failed)?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(failed)
}

/// Files (or folders, with `folders`) directly in `dir`, sorted; none when it is missing.
fn entries_in(dir: &Path, folders: bool) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| if folders { p.is_dir() } else { p.is_file() })
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    paths
}

fn hidden(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.') || n.eq_ignore_ascii_case("README.md"))
}

/// Loads a snapshot from the data-dir convention. A missing dir is an empty snapshot.
pub fn load(dir: &Path) -> Result<Snapshot, LoadError> {
    load_with(dir, &[])
}

/// Like [`load`], parsing `ranges/<class>/<name>` of a configured source in its `format`
/// (the other files are detected from their content).
pub fn load_with(
    dir: &Path,
    sources: &[crate::config::SourceSettings],
) -> Result<Snapshot, LoadError> {
    let mut snapshot = Snapshot::default();
    let mut triples = Vec::new();
    let listed = dates::listed(dir);
    let add_source = |snapshot: &mut Snapshot,
                      path: &Path,
                      text: &str,
                      class: String,
                      entries: usize|
     -> Result<u16, LoadError> {
        let file = relative(dir, path);
        let modified_ms = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok());
        let (dated_ms, dated_by) = match (dates::published(text), listed.get(&file)) {
            (Some(at), _) => (Some(at), dates::DatedBy::Published),
            (None, Some(&at)) => (Some(at), dates::DatedBy::SourcesMd),
            (None, None) => (modified_ms, dates::DatedBy::Modified),
        };
        let id = u16::try_from(snapshot.sources.len()).map_err(|_| LoadError {
            file: file.clone(),
            line: 0,
            reason: "more than 65535 sources".to_owned(),
        })?;
        snapshot.sources.push(Source {
            file,
            class,
            entries,
            modified_ms,
            dated_ms,
            dated_by,
        });
        Ok(id)
    };
    for class_dir in entries_in(&dir.join("ranges"), true) {
        let class = class_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("other")
            .to_owned();
        for path in entries_in(&class_dir, false)
            .into_iter()
            .filter(|p| !hidden(p))
        {
            let text = read(dir, &path)?;
            let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let format = sources
                .iter()
                .find(|s| {
                    s.class == class
                        && (s.name == file_name
                            || file_name.strip_suffix(".gz") == Some(s.name.as_str()))
                })
                .map_or(parse::RangeFormat::Auto, |s| s.format);
            let ranges = parse::parse_ranges_as(&text, format).map_err(|e| LoadError {
                file: relative(dir, &path),
                line: e.line,
                reason: e.reason,
            })?;
            let id = add_source(&mut snapshot, &path, &text, class.clone(), ranges.len())?;
            snapshot.ranges += ranges.len();
            triples.extend(ranges.into_iter().map(|(s, e)| (s, e, id)));
        }
    }
    snapshot.table = RangeTable::build(triples);
    for path in entries_in(&dir.join("asns"), false)
        .into_iter()
        .filter(|p| !hidden(p))
    {
        // `datacenter.txt` or `datacenter.txt.gz`: the class is the name before the first dot.
        let class = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.split('.').next())
            .filter(|n| !n.is_empty())
            .unwrap_or("other")
            .to_owned();
        let text = read(dir, &path)?;
        let asns = parse::parse_asns(&text).map_err(|e| LoadError {
            file: relative(dir, &path),
            line: e.line,
            reason: e.reason,
        })?;
        let id = add_source(&mut snapshot, &path, &text, class, asns.len())?;
        for asn in asns {
            let entry = snapshot.asn_classes.entry(asn).or_default();
            if !entry.contains(&id) {
                entry.push(id);
            }
        }
    }
    let mut asn_rows: Vec<(u128, u128, u32, Arc<str>)> = Vec::new();
    for path in entries_in(&dir.join("asn"), false)
        .into_iter()
        .filter(|p| !hidden(p))
    {
        let name = relative(dir, &path);
        if path.extension().is_some_and(|e| e == "mmdb") {
            let reader = maxminddb::Reader::open_readfile(&path).map_err(|e| LoadError {
                file: name.clone(),
                line: 0,
                reason: e.to_string(),
            })?;
            reader.verify().map_err(|e| LoadError {
                file: name.clone(),
                line: 0,
                reason: format!("corrupt database: {e}"),
            })?;
            snapshot.mmdbs.push(reader);
        } else {
            let text = read(dir, &path)?;
            for (index, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let bad = |reason: &str| LoadError {
                    file: name.clone(),
                    line: index + 1,
                    reason: reason.to_owned(),
                };
                let mut columns = line.splitn(4, ',');
                let start: IpAddr = columns
                    .next()
                    .unwrap_or("")
                    .trim()
                    .parse()
                    .map_err(|_| bad("start is not an IP"))?;
                let end: IpAddr = columns
                    .next()
                    .unwrap_or("")
                    .trim()
                    .parse()
                    .map_err(|_| bad("end is not an IP"))?;
                let asn: u32 = columns
                    .next()
                    .unwrap_or("")
                    .trim()
                    .trim_start_matches("AS")
                    .parse()
                    .map_err(|_| bad("asn is not a number"))?;
                let org = columns.next().unwrap_or("").trim().trim_matches('"');
                asn_rows.push((
                    parse::position(start),
                    parse::position(end),
                    asn,
                    Arc::from(org),
                ));
            }
        }
    }
    asn_rows.sort_by_key(|row| row.0);
    for (start, end, asn, org) in asn_rows {
        snapshot.asn_ranges.starts.push(start);
        snapshot.asn_ranges.ends.push(end);
        snapshot.asn_ranges.asns.push(asn);
        snapshot.asn_ranges.orgs.push(org);
    }
    snapshot.asn_ranges.v4_index = table::V4Index::new(&snapshot.asn_ranges.starts);
    Ok(snapshot)
}
