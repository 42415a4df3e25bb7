//! Edge export: the budgets and deny entries a CDN can enforce, in its own rule format.
//!
//! Cloudflare rulesets and lists, AWS WAF rules and IP sets, Fastly VCL; everything the
//! edge cannot express is listed.
//!
//! Expressible: per-IP budgets counting every request (`ip`/`endpoint_ip`, `when =
//! "always"`) of classes matched by path patterns (or of every class), whose period the
//! provider supports; deny entries of addresses, networks and ASNs. Not expressible at the
//! edge: budgets keyed by user or device, budgets that depend on whether a request is signed
//! in, the `read`/`write` fallback classes, multipliers (reputation, lockouts, scoring), and
//! account or device deny entries.

use serde_json::{Value, json};

use crate::config::{BudgetSettings, LimitSettings, ScopeKind, When};
use crate::reputation::lists::{Entry, EntryKind};

/// A provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Cloudflare rate limiting rules, custom rules and IP lists (JSON).
    Cloudflare,
    /// AWS WAF rate-based rules and IP sets (JSON).
    AwsWaf,
    /// Fastly VCL (ACL, rate counters and penalty boxes).
    Fastly,
}

impl Provider {
    /// `cloudflare`, `aws-waf` or `fastly`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "cloudflare" => Some(Self::Cloudflare),
            "aws-waf" => Some(Self::AwsWaf),
            "fastly" => Some(Self::Fastly),
            _ => None,
        }
    }
}

/// An export: the document and its media type.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// `application/json` or `text/plain` (VCL).
    pub content_type: &'static str,
    /// The rules.
    pub body: String,
}

/// Cloudflare's rate limiting periods, seconds.
const CLOUDFLARE_PERIODS: &[u32] = &[10, 60, 120, 300, 600, 3600];
/// AWS WAF's evaluation windows, seconds; its smallest limit.
const AWS_WINDOWS: &[u32] = &[60, 120, 300, 600];
const AWS_MIN_LIMIT: u64 = 10;

/// A path pattern as the edge matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Match {
    Exactly(String),
    StartsWith(String),
    EndsWith(String),
    Contains(String),
    /// A regular expression (several wildcards).
    Regex(String),
}

fn path_match(pattern: &str, lowercase: bool) -> Match {
    let p = if lowercase {
        pattern.to_ascii_lowercase()
    } else {
        pattern.to_owned()
    };
    let stars = p.matches('*').count();
    match stars {
        0 => Match::Exactly(p),
        1 if p.ends_with('*') => Match::StartsWith(p.trim_end_matches('*').to_owned()),
        1 if p.starts_with('*') => Match::EndsWith(p.trim_start_matches('*').to_owned()),
        2 if p.starts_with('*') && p.ends_with('*') => {
            Match::Contains(p.trim_matches('*').to_owned())
        }
        _ => {
            let body: Vec<String> = p.split('*').map(regex_escape).collect();
            Match::Regex(format!("^{}$", body.join(".*")))
        }
    }
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+?()[]{}|^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// The path patterns and methods a budget applies to at the edge.
type EdgeScope = (Vec<String>, Vec<String>);

/// A budget the edge can enforce: the path patterns and methods it applies to (None: every
/// request), or why not.
fn edge_scope(
    limits: &LimitSettings,
    budget: &BudgetSettings,
) -> Result<Option<EdgeScope>, String> {
    if !matches!(budget.scope, ScopeKind::Ip | ScopeKind::EndpointIp) {
        return Err(format!(
            "budget {}: keyed by {} (the edge knows only the client address)",
            budget.name,
            budget.scope.as_str()
        ));
    }
    if budget.when != When::Always {
        return Err(format!(
            "budget {}: counts only {} requests (the edge does not know who is signed in)",
            budget.name,
            if budget.when == When::Authenticated {
                "signed-in"
            } else {
                "anonymous"
            }
        ));
    }
    if budget.shadow {
        return Err(format!(
            "budget {}: shadow (reported, never enforced)",
            budget.name
        ));
    }
    if budget.classes.is_empty() {
        return Ok(None);
    }
    let mut paths = Vec::new();
    let mut methods = Vec::new();
    for name in &budget.classes {
        let class = limits
            .classes
            .get(name)
            .ok_or_else(|| format!("budget {}: class {name} is not configured", budget.name))?;
        if class.paths.is_empty() {
            return Err(format!(
                "budget {}: class {name} is matched by method alone (a fallback class)",
                budget.name
            ));
        }
        if class.shadow {
            return Err(format!("budget {}: class {name} is shadow", budget.name));
        }
        paths.extend(class.paths.iter().cloned());
        if !class.methods.is_empty() {
            if budget.classes.len() > 1 {
                return Err(format!(
                    "budget {}: classes with their own methods, combined",
                    budget.name
                ));
            }
            methods = class.methods.clone();
        }
    }
    Ok(Some((paths, methods)))
}

/// The budgets the edge can enforce, each with its scope; why each other one cannot is
/// added to `notes` (the same reasons for every provider).
fn edge_budgets<'l>(
    limits: &'l LimitSettings,
    notes: &mut Vec<String>,
) -> Vec<(&'l BudgetSettings, Option<EdgeScope>)> {
    let mut out = Vec::new();
    for budget in &limits.budgets {
        if budget.scope == ScopeKind::Global {
            notes.push(format!(
                "budget {}: global (one bucket for all clients; use the origin's capacity)",
                budget.name
            ));
            continue;
        }
        match edge_scope(limits, budget) {
            Ok(scope) => out.push((budget, scope)),
            Err(why) => notes.push(why),
        }
    }
    out
}

fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

fn cloudflare_condition(m: &Match, lowercase: bool) -> String {
    let path = if lowercase {
        "lower(http.request.uri.path)"
    } else {
        "http.request.uri.path"
    };
    match m {
        Match::Exactly(p) => format!("{path} eq {}", quoted(p)),
        Match::StartsWith(p) => format!("starts_with({path}, {})", quoted(p)),
        Match::EndsWith(p) => format!("ends_with({path}, {})", quoted(p)),
        Match::Contains(p) => format!("{path} contains {}", quoted(p)),
        Match::Regex(r) => format!("{path} matches {}", quoted(r)),
    }
}

fn cloudflare(limits: &LimitSettings, deny: &[Entry]) -> Value {
    let lowercase = limits.case_insensitive_paths;
    let mut rules = Vec::new();
    let mut not_expressed = Vec::new();
    for (budget, scope) in edge_budgets(limits, &mut not_expressed) {
        if !CLOUDFLARE_PERIODS.contains(&budget.period_s) {
            not_expressed.push(format!(
                "budget {}: a period of {} s (Cloudflare counts over 10, 60, 120, 300, 600 or 3600 s)",
                budget.name, budget.period_s
            ));
            continue;
        }
        let expression = match &scope {
            None => "true".to_owned(),
            Some((paths, methods)) => {
                let any: Vec<String> = paths
                    .iter()
                    .map(|p| cloudflare_condition(&path_match(p, lowercase), lowercase))
                    .collect();
                let mut expression = format!("({})", any.join(" or "));
                if !methods.is_empty() {
                    let set: Vec<String> = methods
                        .iter()
                        .map(|m| quoted(&m.to_ascii_uppercase()))
                        .collect();
                    expression = format!(
                        "http.request.method in {{{}}} and {expression}",
                        set.join(" ")
                    );
                }
                expression
            }
        };
        rules.push(json!({
            "description": format!("palisade {}: {} per {} s per IP", budget.name, budget.limit, budget.period_s),
            "expression": expression,
            "action": "block",
            "ratelimit": {
                "characteristics": ["ip.src", "cf.colo.id"],
                "period": budget.period_s,
                "requests_per_period": budget.limit,
                "mitigation_timeout": budget.period_s.min(86_400),
            },
            "enabled": true,
        }));
    }
    let (items, asns, rest) = split_deny(deny);
    not_expressed.extend(rest);
    let mut custom = Vec::new();
    if !items.is_empty() {
        custom.push(json!({
            "description": "palisade deny list: addresses and networks",
            "expression": "ip.src in $palisade_deny",
            "action": "block",
            "enabled": true,
        }));
    }
    if !asns.is_empty() {
        let set: Vec<String> = asns.iter().map(u32::to_string).collect();
        custom.push(json!({
            "description": "palisade deny list: ASNs",
            "expression": format!("ip.src.asnum in {{{}}}", set.join(" ")),
            "action": "block",
            "enabled": true,
        }));
    }
    not_expressed.push(multipliers_note());
    json!({
        "rate_limiting_rules": {"rules": rules},
        "custom_rules": {"rules": custom},
        "lists": [{
            "name": "palisade_deny",
            "kind": "ip",
            "description": "Palisade's deny entries of addresses and networks",
            "items": items.iter().map(|(value, reason)| json!({"ip": value, "comment": reason})).collect::<Vec<_>>(),
        }],
        "not_expressed": not_expressed,
    })
}

/// Deny entries split into addresses/networks (with their reasons), ASNs, and the rest.
fn split_deny(deny: &[Entry]) -> (Vec<(String, String)>, Vec<u32>, Vec<String>) {
    let (mut items, mut asns, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    for entry in deny {
        match entry.kind {
            EntryKind::Cidr if crate::reputation::lists::too_broad(&entry.value) => {
                rest.push(format!(
                    "deny entry {} ({}): broader than /8 (IPv4) or /16 (IPv6), enforced by \
                     Palisade but never exported (an edge would refuse everyone)",
                    entry.id, entry.value
                ))
            }
            EntryKind::Cidr => items.push((entry.value.clone(), entry.reason.clone())),
            EntryKind::Asn => {
                if let Ok(asn) = entry
                    .value
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .parse()
                {
                    asns.push(asn);
                }
            }
            EntryKind::Account | EntryKind::Device => rest.push(format!(
                "deny entry {} ({:?}): the edge does not know accounts or devices",
                entry.id, entry.kind
            )),
        }
    }
    asns.sort_unstable();
    asns.dedup();
    (items, asns, rest)
}

fn multipliers_note() -> String {
    "multipliers (reputation classes such as datacenter and Tor, lockouts, scoring): use the provider's managed lists of anonymizers and hosting networks, or keep those checks at the origin".to_owned()
}

fn aws_match(m: &Match, field: Value) -> Value {
    let transform = json!([{"Priority": 0, "Type": "LOWERCASE"}]);
    let byte = |search: &str, position: &str| {
        json!({"ByteMatchStatement": {
            "SearchString": search, "FieldToMatch": field, "TextTransformations": transform,
            "PositionalConstraint": position,
        }})
    };
    match m {
        Match::Exactly(p) => byte(p, "EXACTLY"),
        Match::StartsWith(p) => byte(p, "STARTS_WITH"),
        Match::EndsWith(p) => byte(p, "ENDS_WITH"),
        Match::Contains(p) => byte(p, "CONTAINS"),
        Match::Regex(r) => json!({"RegexMatchStatement": {
            "RegexString": r, "FieldToMatch": field, "TextTransformations": transform,
        }}),
    }
}

/// One statement of several: `OrStatement` / `AndStatement` need two or more.
fn combine(kind: &str, mut statements: Vec<Value>) -> Value {
    if statements.len() == 1 {
        statements.remove(0)
    } else {
        json!({ kind: {"Statements": statements} })
    }
}

/// The window and limit AWS WAF can count a budget in: the smallest supported window over
/// which the budget's rate is a whole number of at least 10 requests.
fn aws_window(budget: &BudgetSettings) -> Option<(u32, u64)> {
    AWS_WINDOWS.iter().find_map(|&window| {
        let scaled = u64::from(budget.limit) * u64::from(window);
        let period = u64::from(budget.period_s);
        (scaled % period == 0 && scaled / period >= AWS_MIN_LIMIT)
            .then(|| (window, scaled / period))
    })
}

fn aws_waf(limits: &LimitSettings, deny: &[Entry]) -> Value {
    let mut rules = Vec::new();
    let mut not_expressed = Vec::new();
    let visibility = |name: &str| json!({"SampledRequestsEnabled": true, "CloudWatchMetricsEnabled": true, "MetricName": name});
    let mut priority = 0u32;
    for (budget, scope) in edge_budgets(limits, &mut not_expressed) {
        let Some((window, limit)) = aws_window(budget) else {
            not_expressed.push(format!(
                "budget {}: {} per {} s is not a whole number of at least {AWS_MIN_LIMIT} requests over 60, 120, 300 or 600 s",
                budget.name, budget.limit, budget.period_s
            ));
            continue;
        };
        let mut statement = json!({
            "Limit": limit, "EvaluationWindowSec": window, "AggregateKeyType": "IP",
        });
        if let Some((paths, methods)) = &scope {
            let any = combine(
                "OrStatement",
                paths
                    .iter()
                    .map(|p| aws_match(&path_match(p, true), json!({"UriPath": {}})))
                    .collect(),
            );
            let mut all = vec![any];
            if !methods.is_empty() {
                all.push(combine(
                    "OrStatement",
                    methods
                        .iter()
                        .map(|m| {
                            aws_match(
                                &Match::Exactly(m.to_ascii_lowercase()),
                                json!({"Method": {}}),
                            )
                        })
                        .collect(),
                ));
            }
            statement["ScopeDownStatement"] = combine("AndStatement", all);
        }
        let name = format!("palisade-{}", budget.name);
        rules.push(json!({
            "Name": name, "Priority": priority, "Action": {"Block": {}},
            "Statement": {"RateBasedStatement": statement},
            "VisibilityConfig": visibility(&name),
        }));
        priority += 1;
    }
    let (items, asns, rest) = split_deny(deny);
    not_expressed.extend(rest);
    let (v4, v6): (Vec<String>, Vec<String>) = items
        .into_iter()
        .map(|(value, _)| {
            if value.contains('/') {
                value
            } else if value.contains(':') {
                format!("{value}/128")
            } else {
                format!("{value}/32")
            }
        })
        .partition(|value| !value.contains(':'));
    let mut ip_sets = Vec::new();
    for (version, addresses) in [("IPV4", v4), ("IPV6", v6)] {
        if addresses.is_empty() {
            continue;
        }
        let name = format!("palisade-deny-{}", version.to_ascii_lowercase());
        ip_sets.push(json!({
            "Name": name, "Scope": "REGIONAL", "IPAddressVersion": version, "Addresses": addresses,
            "Description": "Palisade's deny entries of addresses and networks",
        }));
        rules.push(json!({
            "Name": name, "Priority": priority, "Action": {"Block": {}},
            "Statement": {"IPSetReferenceStatement": {"ARN": format!("<ARN of IP set {name}>")}},
            "VisibilityConfig": visibility(&name),
        }));
        priority += 1;
    }
    if !asns.is_empty() {
        rules.push(json!({
            "Name": "palisade-deny-asn", "Priority": priority, "Action": {"Block": {}},
            "Statement": {"AsnMatchStatement": {"AsnList": asns}},
            "VisibilityConfig": visibility("palisade-deny-asn"),
        }));
    }
    not_expressed.push(multipliers_note());
    json!({"rules": rules, "ip_sets": ip_sets, "not_expressed": not_expressed})
}

fn fastly(limits: &LimitSettings, deny: &[Entry]) -> String {
    let (items, asns, rest) = split_deny(deny);
    let mut out = String::from(
        "# Palisade's edge rules for Fastly (VCL). Include in vcl_recv; rate counters need\n# Fastly's Edge Rate Limiting.\n\n",
    );
    out.push_str("acl palisade_deny {\n");
    for (value, reason) in &items {
        let (address, prefix) = value
            .split_once('/')
            .map_or((value.as_str(), None), |(a, p)| (a, Some(p)));
        match prefix {
            Some(prefix) => out.push_str(&format!(
                "  \"{address}\"/{prefix}; # {}\n",
                crate::model::one_line(reason)
            )),
            None => out.push_str(&format!(
                "  \"{address}\"; # {}\n",
                crate::model::one_line(reason)
            )),
        }
    }
    out.push_str("}\n\n");
    let mut checks = Vec::new();
    let mut notes: Vec<String> = rest;
    for (budget, scope) in edge_budgets(limits, &mut notes) {
        // check_rate counts whole requests per second over 1, 10 or 60 s.
        if budget.limit % budget.period_s != 0 {
            notes.push(format!(
                "budget {}: {} per {} s is not a whole number of requests per second (Fastly's check_rate)",
                budget.name, budget.limit, budget.period_s
            ));
            continue;
        }
        let rps = budget.limit / budget.period_s;
        let name = budget
            .name
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        out.push_str(&format!(
            "ratecounter rc_{name} {{}}\npenaltybox pb_{name} {{}}\n"
        ));
        let condition = match &scope {
            None => "true".to_owned(),
            Some((paths, _)) => paths
                .iter()
                .map(|p| {
                    format!(
                        "std.tolower(req.url.path) ~ \"{}\"",
                        match path_match(p, true) {
                            Match::Exactly(p) => format!("^{}$", regex_escape(&p)),
                            Match::StartsWith(p) => format!("^{}", regex_escape(&p)),
                            Match::EndsWith(p) => format!("{}$", regex_escape(&p)),
                            Match::Contains(p) => regex_escape(&p),
                            Match::Regex(r) => r,
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join(" || "),
        };
        checks.push(format!(
            "  if (({condition}) && ratelimit.check_rate(client.ip, rc_{name}, 1, 60, {rps}, pb_{name}, 1m)) {{\n    error 429 \"Too many requests\";\n  }}\n"
        ));
    }
    out.push_str("\nsub palisade_recv {\n  if (client.ip ~ palisade_deny) {\n    error 403 \"Forbidden\";\n  }\n");
    if !asns.is_empty() {
        let list: Vec<String> = asns
            .iter()
            .map(|a| format!("client.as.number == {a}"))
            .collect();
        out.push_str(&format!(
            "  if ({}) {{\n    error 403 \"Forbidden\";\n  }}\n",
            list.join(" || ")
        ));
    }
    for check in checks {
        out.push_str(&check);
    }
    out.push_str("}\n");
    notes.push(multipliers_note());
    out.push_str("\n# Not expressed at the edge:\n");
    for note in notes {
        out.push_str(&format!("#   {note}\n"));
    }
    out
}

/// The export of `limits` and the live deny entries for `provider`.
pub fn export(provider: Provider, limits: &LimitSettings, deny: &[Entry]) -> Exported {
    match provider {
        Provider::Cloudflare => Exported {
            content_type: "application/json",
            body: serde_json::to_string_pretty(&cloudflare(limits, deny)).unwrap_or_default(),
        },
        Provider::AwsWaf => Exported {
            content_type: "application/json",
            body: serde_json::to_string_pretty(&aws_waf(limits, deny)).unwrap_or_default(),
        },
        Provider::Fastly => Exported {
            content_type: "text/plain; charset=utf-8",
            body: fastly(limits, deny),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_become_edge_matches() {
        assert_eq!(
            path_match("/Auth/*", true),
            Match::StartsWith("/auth/".into())
        );
        assert_eq!(path_match("/login", true), Match::Exactly("/login".into()));
        assert_eq!(
            path_match("*/search", true),
            Match::EndsWith("/search".into())
        );
        assert_eq!(
            path_match("*/report*", true),
            Match::Contains("/report".into())
        );
        assert_eq!(
            path_match("/a/*/b.json", true),
            Match::Regex("^/a/.*/b\\.json$".into())
        );
    }

    #[test]
    fn aws_windows_keep_the_rate_with_at_least_ten_requests() {
        let budget = |limit, period_s| BudgetSettings {
            limit,
            period_s,
            ..LimitSettings::default().budgets[0].clone()
        };
        assert_eq!(aws_window(&budget(10, 60)), Some((60, 10)));
        assert_eq!(aws_window(&budget(5, 60)), Some((120, 10)));
        assert_eq!(aws_window(&budget(20, 60)), Some((60, 20)));
        assert_eq!(aws_window(&budget(1, 3600)), None);
    }
}
