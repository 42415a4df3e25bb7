//! `[reputation]`: the factor each reputation class contributes to an IP's multiplier.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// A range source that `palisade ranges update` downloads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSettings {
    /// File name under `ranges/<class>/` (no `/`).
    pub name: String,
    /// Class it assigns (the folder).
    pub class: String,
    /// Where to download it from (`https://…` or `http://…`); empty: a local file that
    /// `palisade ranges update` leaves alone (the entry then only sets its format).
    #[serde(default)]
    pub url: String,
    /// How `ranges/<class>/<name>` is parsed: `auto` (detected from the content, the
    /// default), `cidr`, `csv`, `json` (AWS / Google) or `urls` (proxy URLs).
    #[serde(default)]
    pub format: RangeFormat,
}

/// The `[reputation]` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReputationSettings {
    /// Factor per class (0 blocks, 1 is neutral); the strictest class of an IP wins. Classes
    /// not listed use `default_factor`. TOML `reputation.factors`; defaults: datacenter 0.5,
    /// vpn 0.5, proxy 0.25, tor 0.25. The manual lists are fixed: deny 0, allow ≥ 1.
    pub factors: BTreeMap<String, f64>,
    /// Factor per class on public endpoint classes (`scoring.public_classes`, default
    /// `auth`), where unauthenticated traffic arrives; classes not listed use `factors`.
    /// TOML `reputation.public_factors`; defaults: datacenter 0.25, vpn 0.25, proxy 0.1,
    /// tor 0.1.
    pub public_factors: BTreeMap<String, f64>,
    /// Factor of a class that `factors` does not list. Env
    /// `PALISADE_REPUTATION__DEFAULT_FACTOR`; default 0.5.
    pub default_factor: f64,
    /// Sources `palisade ranges update` downloads. TOML `[[reputation.sources]]`; giving any
    /// replaces the defaults (AWS, Google Cloud, the Tor bulk exit list).
    pub sources: Vec<SourceSettings>,
}

impl Default for ReputationSettings {
    fn default() -> Self {
        Self {
            factors: BTreeMap::from([
                ("datacenter".to_owned(), 0.5),
                ("vpn".to_owned(), 0.5),
                ("proxy".to_owned(), 0.25),
                ("tor".to_owned(), 0.25),
            ]),
            public_factors: BTreeMap::from([
                ("datacenter".to_owned(), 0.25),
                ("vpn".to_owned(), 0.25),
                ("proxy".to_owned(), 0.1),
                ("tor".to_owned(), 0.1),
            ]),
            default_factor: 0.5,
            sources: vec![
                SourceSettings {
                    name: "aws-ip-ranges.json".to_owned(),
                    class: "datacenter".to_owned(),
                    url: "https://ip-ranges.amazonaws.com/ip-ranges.json".to_owned(),
                    format: RangeFormat::Json,
                },
                SourceSettings {
                    name: "google-cloud.json".to_owned(),
                    class: "datacenter".to_owned(),
                    url: "https://www.gstatic.com/ipranges/cloud.json".to_owned(),
                    format: RangeFormat::Json,
                },
                SourceSettings {
                    name: "tor-exits.txt".to_owned(),
                    class: "tor".to_owned(),
                    url: "https://check.torproject.org/torbulkexitlist".to_owned(),
                    format: RangeFormat::Cidr,
                },
            ],
        }
    }
}

impl ReputationSettings {
    /// The factor of `class`.
    pub fn factor(&self, class: &str) -> f64 {
        self.factors
            .get(class)
            .copied()
            .unwrap_or(self.default_factor)
    }

    /// The factor of `class` on a public endpoint class.
    pub fn public_factor(&self, class: &str) -> f64 {
        self.public_factors
            .get(class)
            .copied()
            .unwrap_or_else(|| self.factor(class))
    }

    pub(super) fn validate(&self) -> Result<(), SettingError> {
        let bad = |f: f64| !(0.0..=10.0).contains(&f) || f.is_nan();
        if bad(self.default_factor) {
            return Err(SettingError::new(
                setting_name("reputation.default_factor"),
                "must be between 0 and 10",
            ));
        }
        let plain = |text: &str| {
            !text.is_empty()
                && text != "."
                && text != ".."
                && !text.contains(['/', '\\'])
                && !text.starts_with('.')
        };
        for (index, source) in self.sources.iter().enumerate() {
            let key = format!("reputation.sources[{index}] ({})", source.name);
            if !plain(&source.name) || !plain(&source.class) {
                return Err(SettingError::new(
                    key,
                    "name and class must be plain file/folder names (no '/', not hidden)",
                ));
            }
            if !(source.url.is_empty()
                || source.url.starts_with("https://")
                || source.url.starts_with("http://"))
            {
                return Err(SettingError::new(
                    key,
                    "url must start with https:// or http:// (or be empty for a local file)",
                ));
            }
        }
        if let Some((class, _)) = self.public_factors.iter().find(|(_, f)| bad(**f)) {
            return Err(SettingError::new(
                format!("reputation.public_factors.{class}"),
                "must be between 0 (block) and 10",
            ));
        }
        if let Some((class, _)) = self.factors.iter().find(|(_, f)| bad(**f)) {
            return Err(SettingError::new(
                format!("reputation.factors.{class}"),
                "must be between 0 (block) and 10",
            ));
        }
        Ok(())
    }
}

/// The format of a range file (`[[reputation.sources]] format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RangeFormat {
    /// Detected from the content.
    #[default]
    Auto,
    /// One IP or CIDR per line, `#` comments.
    Cidr,
    /// CSV rows: a CIDR column, start,end columns, or an IP column; a header line is skipped.
    Csv,
    /// AWS `ip-ranges.json` or Google `cloud.json`.
    Json,
    /// Proxy URLs (`scheme://IP:port`).
    Urls,
}

impl RangeFormat {
    /// The name in the settings.
    pub fn as_str(self) -> &'static str {
        match self {
            RangeFormat::Auto => "auto",
            RangeFormat::Cidr => "cidr",
            RangeFormat::Csv => "csv",
            RangeFormat::Json => "json",
            RangeFormat::Urls => "urls",
        }
    }
}
