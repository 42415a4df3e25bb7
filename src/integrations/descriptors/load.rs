//! Reading envoyproxy/ratelimit config files as upstream reads them.
//!
//! The keys upstream accepts, its checks and its error messages (`<file>: <what>`), over a
//! generic YAML tree (scalars are read as strings where upstream's decoder does, so
//! `value: 123` is the value `"123"`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_yaml_ng::Value;

use super::{Limit, MultiplierSource, Node, Rules, Unit};

/// Keys a config file may use (upstream's, plus Palisade's `multiplier`).
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "multiplier",
];

/// A config file that cannot be used, named as upstream names it: `<file>: <what>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    /// The file (as given).
    pub file: String,
    /// What is wrong.
    pub message: String,
}

fn error(file: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        message: message.into(),
    }
}

/// A scalar as Go's YAML decoder renders it into a string field.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

fn validate_keys(file: &str, map: &serde_yaml_ng::Mapping) -> Result<(), ConfigError> {
    for (key, value) in map {
        let Value::String(key) = key else {
            let shown = scalar(key).unwrap_or_else(|| format!("{key:?}"));
            return Err(error(
                file,
                format!("config error, key is not of type string: {shown}"),
            ));
        };
        if !VALID_KEYS.contains(&key.as_str()) {
            return Err(error(file, format!("config error, unknown key '{key}'")));
        }
        if key == "metadata" {
            continue;
        }
        match value {
            Value::Sequence(items) => {
                for item in items {
                    let Value::Mapping(item) = item else {
                        let shown = scalar(item).unwrap_or_else(|| format!("{item:?}"));
                        return Err(error(
                            file,
                            format!(
                                "config error, yaml file contains list of type other than map: {shown}"
                            ),
                        ));
                    };
                    validate_keys(file, item)?;
                }
            }
            Value::Mapping(inner) => validate_keys(file, inner)?,
            Value::String(_) | Value::Bool(_) | Value::Null => {}
            Value::Number(n) if n.is_i64() || n.is_u64() => {}
            _ => return Err(error(file, "error checking config")),
        }
    }
    Ok(())
}

fn get<'v>(map: &'v serde_yaml_ng::Mapping, key: &str) -> Option<&'v Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn string(file: &str, map: &serde_yaml_ng::Mapping, key: &str) -> Result<String, ConfigError> {
    match get(map, key) {
        None => Ok(String::new()),
        Some(value) => scalar(value).ok_or_else(|| {
            error(
                file,
                format!("error loading config file: '{key}' is not a string"),
            )
        }),
    }
}

fn flag(file: &str, map: &serde_yaml_ng::Mapping, key: &str) -> Result<bool, ConfigError> {
    match get(map, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(error(
            file,
            format!("error loading config file: '{key}' must be true or false"),
        )),
    }
}

/// One parsed file: its domain and descriptors, validated as YAML.
#[derive(Debug, Clone)]
pub struct File {
    name: String,
    root: serde_yaml_ng::Mapping,
}

/// Parses one file's content (upstream's `ConfigFileContentToYaml`).
pub fn parse(name: &str, content: &str) -> Result<File, ConfigError> {
    let value: Value = serde_yaml_ng::from_str(content)
        .map_err(|err| error(name, format!("error loading config file: {err}")))?;
    let root = match value {
        Value::Mapping(map) => map,
        Value::Null => serde_yaml_ng::Mapping::new(),
        _ => {
            return Err(error(
                name,
                "error loading config file: the file is not a mapping",
            ));
        }
    };
    validate_keys(name, &root)?;
    Ok(File {
        name: name.to_owned(),
        root,
    })
}

impl Rules {
    /// Builds the rules from parsed files, in order (upstream's `NewRateLimitConfigImpl`).
    /// A domain in two files is an error unless `merge_domains`.
    pub fn build(files: &[File], merge_domains: bool) -> Result<Self, ConfigError> {
        let mut rules = Rules::default();
        for file in files {
            let domain = string(&file.name, &file.root, "domain")?;
            if domain.is_empty() {
                return Err(error(&file.name, "config file cannot have empty domain"));
            }
            let descriptors = sequence(&file.name, &file.root)?;
            match rules.domains.get_mut(&domain) {
                Some(_) if !merge_domains => {
                    return Err(error(
                        &file.name,
                        format!("duplicate domain '{domain}' in config file"),
                    ));
                }
                Some(node) => load_level(&file.name, node, &format!("{domain}."), descriptors)?,
                None => {
                    let mut node = Node::default();
                    load_level(&file.name, &mut node, &format!("{domain}."), descriptors)?;
                    rules.domains.insert(domain, node);
                }
            }
        }
        Ok(rules)
    }
}

fn sequence<'v>(file: &str, map: &'v serde_yaml_ng::Mapping) -> Result<&'v [Value], ConfigError> {
    match get(map, "descriptors") {
        None => Ok(&[]),
        Some(Value::Sequence(items)) => Ok(items),
        Some(_) => Err(error(
            file,
            "error loading config file: 'descriptors' must be a list",
        )),
    }
}

fn load_level(
    file: &str,
    node: &mut Node,
    parent_key: &str,
    descriptors: &[Value],
) -> Result<(), ConfigError> {
    for descriptor in descriptors {
        let Value::Mapping(map) = descriptor else {
            return Err(error(
                file,
                "error loading config file: a descriptor is not a mapping",
            ));
        };
        let key = string(file, map, "key")?;
        if key.is_empty() {
            return Err(error(file, "descriptor has empty key"));
        }
        let value = string(file, map, "value")?;
        let final_key = if value.is_empty() {
            key.clone()
        } else {
            format!("{key}_{value}")
        };
        let full_key = format!("{parent_key}{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(error(
                file,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        let shadow_mode = flag(file, map, "shadow_mode")?;
        let quota_mode = flag(file, map, "quota_mode")?;
        let detailed_metric = flag(file, map, "detailed_metric")?;
        let share_threshold = flag(file, map, "share_threshold")?;
        let multiplier = match string(file, map, "multiplier")?.as_str() {
            "" => None,
            "ip" => Some(MultiplierSource::Ip),
            "user" => Some(MultiplierSource::User),
            "device" => Some(MultiplierSource::Device),
            other => {
                return Err(error(
                    file,
                    format!("invalid multiplier '{other}' (ip, user or device)"),
                ));
            }
        };
        let limit = match get(map, "rate_limit") {
            None => None,
            Some(Value::Mapping(rate)) => Some(Arc::new(rate_limit(
                file,
                rate,
                full_key.clone(),
                [shadow_mode, quota_mode, detailed_metric],
                multiplier,
            )?)),
            Some(_) => {
                return Err(error(
                    file,
                    "error loading config file: 'rate_limit' must be a mapping",
                ));
            }
        };
        if share_threshold && !final_key.contains('*') {
            return Err(error(
                file,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                ),
            ));
        }
        if final_key.contains('*') {
            node.wildcards.push((
                final_key.clone(),
                final_key.split('*').map(str::to_owned).collect(),
            ));
        }
        let mut child = Node {
            children: HashMap::new(),
            limit,
            wildcards: Vec::new(),
            value_to_metric: flag(file, map, "value_to_metric")?,
            share_threshold,
            wildcard_pattern: if share_threshold {
                final_key.clone()
            } else {
                String::new()
            },
        };
        load_level(
            file,
            &mut child,
            &format!("{full_key}."),
            sequence(file, map)?,
        )?;
        node.children.insert(final_key, child);
    }
    Ok(())
}

fn rate_limit(
    file: &str,
    rate: &serde_yaml_ng::Mapping,
    full_key: String,
    [shadow_mode, quota_mode, detailed_metric]: [bool; 3],
    multiplier: Option<MultiplierSource>,
) -> Result<Limit, ConfigError> {
    let unlimited = flag(file, rate, "unlimited")?;
    let unit_name = string(file, rate, "unit")?;
    let unit = Unit::parse(&unit_name);
    if unlimited && unit.is_some() {
        return Err(error(
            file,
            "should not specify rate limit unit when unlimited",
        ));
    }
    if !unlimited && unit.is_none() {
        return Err(error(
            file,
            format!("invalid rate limit unit '{unit_name}'"),
        ));
    }
    let requests_per_unit = match get(rate, "requests_per_unit") {
        None => 0,
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                error(
                    file,
                    format!("error loading config file: requests_per_unit {n} is not a 32-bit unsigned number"),
                )
            })?,
        Some(_) => {
            return Err(error(
                file,
                "error loading config file: requests_per_unit must be a number",
            ));
        }
    };
    let name = string(file, rate, "name")?;
    let mut replaces = Vec::new();
    match get(rate, "replaces") {
        None => {}
        Some(Value::Sequence(items)) => {
            for item in items {
                let replaced = match item {
                    Value::Mapping(entry) => string(file, entry, "name")?,
                    _ => String::new(),
                };
                if replaced.is_empty() {
                    return Err(error(file, "should not have an empty replaces entry"));
                }
                if replaced == name {
                    return Err(error(
                        file,
                        "replaces should not contain name of same descriptor",
                    ));
                }
                replaces.push(replaced);
            }
        }
        Some(_) => {
            return Err(error(
                file,
                "error loading config file: 'replaces' must be a list",
            ));
        }
    }
    Ok(Limit {
        requests_per_unit,
        unit,
        unlimited,
        name,
        replaces,
        shadow_mode,
        quota_mode,
        detailed_metric,
        multiplier,
        full_key,
    })
}

/// The config files under `paths`: a file as given, a folder's `*.yaml`/`*.yml` files
/// (not hidden ones, not in sub-folders) in name order.
pub fn files_under(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file() && is_config_file(p))
                .collect();
            found.sort();
            out.extend(found);
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

fn is_config_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

/// Reads and builds the rules of every file under `paths`.
pub fn load_paths(paths: &[PathBuf], merge_domains: bool) -> Result<Rules, ConfigError> {
    let files = files_under(paths).map_err(|err| ConfigError {
        file: paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        message: format!("cannot list the config files: {err}"),
    })?;
    let mut parsed = Vec::with_capacity(files.len());
    for path in &files {
        let name = path.display().to_string();
        let content = std::fs::read_to_string(path)
            .map_err(|err| error(&name, format!("cannot read the file: {err}")))?;
        parsed.push(parse(&name, &content)?);
    }
    Rules::build(&parsed, merge_domains)
}
