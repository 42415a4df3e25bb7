//! `palisade policy check`: a candidate file's errors with their line and column, the class
//! patterns no request can reach, the budgets that never apply, and how its `[limits]`
//! differs from the live one.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{BudgetSettings, ClassSettings, LimitSettings, ScopeKind, Settings, When};
use crate::limiter::Budgets;

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// The file cannot be used.
    Error,
    /// Usable, but something in it does nothing.
    Warning,
    /// A difference from the live policy.
    Change,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Error, warning or change.
    pub level: Level,
    /// 1-based line and column in the file, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// 1-based column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    /// What.
    pub message: String,
}

impl Finding {
    fn new(level: Level, at: Option<(usize, usize)>, message: String) -> Self {
        Self {
            level,
            line: at.map(|(l, _)| l),
            column: at.map(|(_, c)| c),
            message,
        }
    }
}

/// Checks `text` (a settings file whose `[limits]` is the candidate) against `live`.
pub fn check(text: &str, live: &LimitSettings) -> Vec<Finding> {
    let candidate = match Settings::candidate_toml(text) {
        Ok(settings) => settings.limits,
        Err(err) => {
            let at = syntax_position(&err.problem).or_else(|| locate(text, &err.setting));
            return vec![Finding::new(Level::Error, at, err.to_string())];
        }
    };
    let mut findings = unreachable_patterns(text, &candidate);
    findings.extend(idle_budgets(text, &candidate));
    findings.extend(diff(text, live, &candidate));
    findings
}

/// `line N, column M` of a TOML syntax error's message.
fn syntax_position(problem: &str) -> Option<(usize, usize)> {
    let rest = &problem[problem.find("line ")? + 5..];
    let line: usize = rest
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let rest = &rest[rest.find("column ")? + 7..];
    let column: usize = rest
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((line, column))
}

/// The components of a setting's name: `limits.budgets[1] (x)` and `limits.budgets.1.limit`
/// both give `limits`, `budgets`, `1`, ….
fn components(setting: &str) -> Vec<String> {
    let name = setting.split_whitespace().next().unwrap_or_default();
    name.replace('[', ".")
        .replace(']', "")
        .split('.')
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Where `setting` is written in `text`: the line of its key, or of its table's header.
fn locate(text: &str, setting: &str) -> Option<(usize, usize)> {
    let wanted = components(setting);
    if wanted.is_empty() {
        return None;
    }
    let mut header: Vec<String> = Vec::new();
    let mut arrays: BTreeMap<String, usize> = BTreeMap::new();
    let mut table_line = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let number = index + 1;
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.split("]]").next()) {
            let name = name.trim().to_owned();
            let slot = arrays.entry(name.clone()).or_insert(0);
            header = name.split('.').map(str::to_owned).collect();
            header.push(slot.to_string());
            *slot += 1;
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.split(']').next()) {
            header = name.trim().split('.').map(str::to_owned).collect();
        } else if let Some((key, _)) = line.split_once('=') {
            let mut path = header.clone();
            path.extend(key.trim().split('.').map(|k| k.trim().to_owned()));
            if path == wanted {
                let column = raw.len() - raw.trim_start().len() + 1;
                return Some((number, column));
            }
            continue;
        } else {
            continue;
        }
        if wanted.starts_with(&header) && table_line.is_none_or(|(_, len)| header.len() > len) {
            table_line = Some((number, header.len()));
        }
    }
    table_line.map(|(line, _)| (line, 1))
}

/// The line of a class's table (`[limits.classes.NAME]`) or of its `paths` key.
fn class_position(text: &str, class: &str) -> Option<(usize, usize)> {
    locate(text, &format!("limits.classes.{class}.paths"))
        .or_else(|| locate(text, &format!("limits.classes.{class}")))
}

/// Class patterns that no request reaches: the pattern's own path (wildcards filled in) is
/// classified as another class that is tried first, for each method the class takes.
fn unreachable_patterns(text: &str, limits: &LimitSettings) -> Vec<Finding> {
    let budgets = Budgets::from_settings(limits);
    let mut out = Vec::new();
    for (name, class) in &limits.classes {
        let Some(index) = budgets.classes.iter().position(|c| &*c.name == name) else {
            continue;
        };
        let methods: Vec<String> = if class.methods.is_empty() {
            vec!["GET".to_owned(), "POST".to_owned()]
        } else {
            class.methods.clone()
        };
        for pattern in &class.paths {
            let example = example_path(pattern);
            let elsewhere: Vec<String> = methods
                .iter()
                .filter_map(|method| {
                    let got = budgets.classify(method, &example);
                    (got != index).then(|| format!("{method} → {}", budgets.classes[got].name))
                })
                .collect();
            if elsewhere.len() == methods.len() {
                out.push(Finding::new(
                    Level::Warning,
                    class_position(text, name),
                    format!(
                        "class {name}: pattern {pattern:?} is unreachable: {example} goes to another class first ({})",
                        elsewhere.join(", ")
                    ),
                ));
            }
        }
    }
    out
}

/// A path a pattern matches: its wildcards filled with a plain segment.
fn example_path(pattern: &str) -> String {
    let filled = pattern.replace('*', "x");
    if filled.starts_with('/') {
        filled
    } else {
        format!("/{filled}")
    }
}

/// Budgets that apply to no request: keyed by a user but counting unauthenticated requests
/// only (a budget naming a class that does not exist is an error of the file).
fn idle_budgets(text: &str, limits: &LimitSettings) -> Vec<Finding> {
    let mut out = Vec::new();
    for (index, budget) in limits.budgets.iter().enumerate() {
        let at = locate(text, &format!("limits.budgets.{index}"));
        let keyed_by_user = matches!(budget.scope, ScopeKind::User | ScopeKind::EndpointUser);
        if keyed_by_user && budget.when == When::Unauthenticated {
            out.push(Finding::new(
                Level::Warning,
                at,
                format!(
                    "budget {}: keyed by the user but counts only requests without one: it never applies",
                    budget.name
                ),
            ));
        }
    }
    out
}

fn budget_summary(b: &BudgetSettings) -> String {
    let classes = if b.classes.is_empty() {
        "all classes".to_owned()
    } else {
        b.classes.join(", ")
    };
    format!(
        "{} per {} s (burst {}), {} scope, {classes}, {}{}",
        b.limit,
        b.period_s,
        b.capacity(),
        b.scope.as_str(),
        format!("{:?}", b.when).to_lowercase(),
        if b.shadow { ", shadow" } else { "" }
    )
}

fn class_summary(c: &ClassSettings) -> String {
    format!(
        "paths {:?}, methods {:?}, fail {}, priority {}{}",
        c.paths,
        c.methods,
        format!("{:?}", c.fail).to_lowercase(),
        c.priority,
        if c.shadow { ", shadow" } else { "" }
    )
}

/// How the candidate's budgets and classes differ from the live ones.
fn diff(text: &str, live: &LimitSettings, candidate: &LimitSettings) -> Vec<Finding> {
    let mut out = Vec::new();
    let live_budgets: BTreeMap<&str, &BudgetSettings> =
        live.budgets.iter().map(|b| (b.name.as_str(), b)).collect();
    for (index, budget) in candidate.budgets.iter().enumerate() {
        let at = locate(text, &format!("limits.budgets.{index}"));
        match live_budgets.get(budget.name.as_str()) {
            None => out.push(Finding::new(
                Level::Change,
                at,
                format!("budget {} added: {}", budget.name, budget_summary(budget)),
            )),
            Some(before) if budget_summary(before) != budget_summary(budget) => {
                out.push(Finding::new(
                    Level::Change,
                    at,
                    format!(
                        "budget {}: {} → {}",
                        budget.name,
                        budget_summary(before),
                        budget_summary(budget)
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    for budget in &live.budgets {
        if !candidate.budgets.iter().any(|b| b.name == budget.name) {
            out.push(Finding::new(
                Level::Change,
                None,
                format!(
                    "budget {} removed (was {})",
                    budget.name,
                    budget_summary(budget)
                ),
            ));
        }
    }
    for (name, class) in &candidate.classes {
        match live.classes.get(name) {
            None => out.push(Finding::new(
                Level::Change,
                class_position(text, name),
                format!("class {name} added: {}", class_summary(class)),
            )),
            Some(before) if class_summary(before) != class_summary(class) => {
                out.push(Finding::new(
                    Level::Change,
                    class_position(text, name),
                    format!(
                        "class {name}: {} → {}",
                        class_summary(before),
                        class_summary(class)
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    for (name, class) in &live.classes {
        if !candidate.classes.contains_key(name) {
            out.push(Finding::new(
                Level::Change,
                None,
                format!("class {name} removed (was {})", class_summary(class)),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_found_by_their_table_and_key() {
        let text = "[limits]\nl1_ttl_ms = 5\n\n[[limits.budgets]]\nname = \"a\"\n\n[[limits.budgets]]\nname = \"b\"\n  limit = 0\n[limits.classes.auth]\npaths = []\n";
        assert_eq!(locate(text, "limits.l1_ttl_ms"), Some((2, 1)));
        assert_eq!(locate(text, "limits.budgets.1.limit"), Some((9, 3)));
        assert_eq!(locate(text, "limits.budgets[1] (b)"), Some((7, 1)));
        assert_eq!(locate(text, "limits.classes.auth.fail"), Some((10, 1)));
        assert_eq!(locate(text, "limits.nothing"), Some((1, 1)));
        assert_eq!(
            syntax_position("TOML parse error at line 3, column 7"),
            Some((3, 7))
        );
    }
}
