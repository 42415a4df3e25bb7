//! How old a range list's data is, from the data's own date: a clone or a copy gives every
//! file a new modification time, so that time says nothing about the data.
//!
//! In order: the timestamp the publisher put in the file (AWS's `ip-ranges.json`
//! `createDate`, Google's `cloud.json` `creationTime`); the snapshot date `data/SOURCES.md`
//! gives the file (the shipped lists); the file's modification time (a list `palisade ranges
//! update` downloaded, or one an operator placed).

use std::collections::HashMap;
use std::path::Path;

/// Where a source's date came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DatedBy {
    /// The publisher's timestamp in the file.
    Published,
    /// The snapshot date in the data folder's `SOURCES.md`.
    SourcesMd,
    /// The file's modification time.
    Modified,
}

/// Unix ms of midnight UTC of the first `YYYY-MM-DD` in `text`.
fn first_date(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    (0..bytes.len().saturating_sub(9)).find_map(|at| {
        let candidate = text.get(at..at + 10)?;
        let date = chrono::NaiveDate::parse_from_str(candidate, "%Y-%m-%d").ok()?;
        let shaped = candidate.as_bytes()[4] == b'-' && candidate.as_bytes()[7] == b'-';
        if !shaped {
            return None;
        }
        Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
    })
}

/// The publisher's date in a list's text: the value of its first `createDate` (AWS) or
/// `creationTime` (Google Cloud) field.
pub fn published(text: &str) -> Option<i64> {
    ["\"createDate\"", "\"creationTime\""]
        .iter()
        .find_map(|field| {
            let at = text.find(field)? + field.len();
            let rest = text.get(at..(at + 64).min(text.len()))?;
            first_date(rest)
        })
}

/// `{a,b}` alternatives in a path written once for several files.
fn expand(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => path[open + 1..close]
            .split(',')
            .flat_map(|choice| expand(&format!("{}{choice}{}", &path[..open], &path[close + 1..])))
            .collect(),
        _ => vec![path.to_owned()],
    }
}

/// The snapshot date of every file the data folder's `SOURCES.md` lists.
///
/// Its table's first column names the file (`` `ranges/tor/x.gz` ``, braces for several),
/// and the first `YYYY-MM-DD` in the fourth column is the snapshot. Files not listed are
/// absent.
pub fn listed(dir: &Path) -> HashMap<String, i64> {
    let Ok(text) = std::fs::read_to_string(dir.join("SOURCES.md")) else {
        return HashMap::new();
    };
    let mut dates = HashMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| file | origin | license | snapshot | entries |` splits into 7 cells.
        if cells.len() < 6 {
            continue;
        }
        let (Some(file), Some(date)) = (
            cells[1].strip_prefix('`').and_then(|f| f.strip_suffix('`')),
            first_date(cells[4]),
        ) else {
            continue;
        };
        for path in expand(file) {
            dates.insert(path, date);
        }
    }
    dates
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_come_from_the_publisher_then_sources_md() {
        assert_eq!(
            published(r#"{"syncToken": "1", "createDate": "2026-08-22-03-33-06", "prefixes": []}"#),
            Some(
                chrono::NaiveDate::from_ymd_opt(2026, 8, 22)
                    .unwrap()
                    .and_hms_opt(0, 0, 0)
                    .unwrap()
                    .and_utc()
                    .timestamp_millis()
            )
        );
        assert!(
            published(r#"{"creationTime": "2024-04-26T21:32:11.99", "prefixes": []}"#).is_some()
        );
        assert_eq!(published("10.0.0.0/8\n"), None);
        assert_eq!(expand("a/{x,y}.gz"), ["a/x.gz", "a/y.gz"]);
        // The shipped data folder dates every list it ships.
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
        let dates = listed(&data);
        let old_tor = dates["ranges/tor/tor-exit-nodes-2024-02.lst.gz"];
        assert_eq!(
            chrono::DateTime::from_timestamp_millis(old_tor)
                .unwrap()
                .date_naive()
                .to_string(),
            "2024-02-27"
        );
        assert!(dates.contains_key("ranges/vpn/x4bnet-vpn-provider-pia.txt.gz"));
        for class in ["datacenter", "vpn", "proxy", "tor"] {
            for entry in std::fs::read_dir(data.join("ranges").join(class)).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                let file = format!("ranges/{class}/{name}");
                assert!(
                    dates.contains_key(&file),
                    "data/SOURCES.md gives {file} no date"
                );
            }
        }
    }
}
