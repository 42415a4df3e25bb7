//! Endpoint classes and budgets: which class a request is in, which budgets apply to it,
//! and the Markdown table `palisade budgets` prints.

use std::sync::Arc;

pub use super::matching::glob_match;
use super::matching::{ClassCache, FirstSegments, Pattern};
use super::target;
use crate::config::{BudgetSettings, FailMode, LimitSettings, ScopeKind, When};
use crate::telemetry::metrics as names;

/// One configured class, ready for matching.
#[derive(Debug, Clone)]
pub struct Class {
    /// Its name.
    pub name: Arc<str>,
    patterns: Vec<Pattern>,
    pattern_text: Vec<String>,
    methods: Vec<String>,
    /// Redis-down behaviour.
    pub fail: FailMode,
    /// Report, never block.
    pub shadow: bool,
    /// Indices into [`Budgets::budgets`] that may apply to this class.
    pub budgets: Vec<usize>,
    /// The handles of the metrics its checks record.
    pub metrics: Arc<ClassMetrics>,
}

/// The metric handles of one class.
///
/// Each is registered on its first use, with the recorder in force then (requests come
/// after `App::build` installed it). A table put in force later registers its own, which
/// name the same series.
#[derive(Debug, Default)]
pub struct ClassMetrics {
    /// Decisions, by deciding scope and outcome.
    pub decisions: names::Handles<(&'static str, &'static str), metrics::Counter>,
    /// What the deciding scope had left, as a ratio of its limit.
    pub remaining: std::sync::OnceLock<metrics::Histogram>,
}

/// Which subjects a request names, for the budgets that key by them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Present {
    /// A user (the request counts as authenticated).
    pub user: bool,
    /// A device id.
    pub device: bool,
    /// A tenant.
    pub tenant: bool,
    /// A message or notification recipient.
    pub recipient: bool,
    /// A recipient with a destination (a phone number or an e-mail address).
    pub destination: bool,
}

impl Present {
    /// The subjects of `request`.
    pub fn of(request: &super::LimitRequest) -> Self {
        Self {
            user: request.user.is_some(),
            device: request.device.is_some(),
            tenant: request.tenant.is_some(),
            recipient: request.recipient.is_some(),
            destination: request
                .recipient
                .as_ref()
                .is_some_and(|r| r.destination.is_some()),
        }
    }
}

/// Every class and budget of the effective settings.
#[derive(Debug, Clone)]
pub struct Budgets {
    /// Classes with patterns first (by priority), then the rest.
    pub classes: Vec<Class>,
    /// The budgets, in settings order.
    pub budgets: Vec<BudgetSettings>,
    /// Budget names, shared by every decision that reports them.
    pub names: Vec<Arc<str>>,
    read: usize,
    write: usize,
    /// Class indexes from the strictest: fail-closed classes first, then by priority.
    strictest_first: Vec<usize>,
    /// Paths are matched lower-cased (`limits.case_insensitive_paths`).
    case_insensitive: bool,
    /// The classes of recently seen (method, endpoint) pairs as sent.
    recent: ClassCache,
    /// The classes a path may be in, by its first segment.
    first_segments: FirstSegments,
}

impl Budgets {
    /// Builds the matcher from validated settings.
    pub fn from_settings(settings: &LimitSettings) -> Self {
        let mut classes: Vec<(i32, Class)> = settings
            .classes
            .iter()
            .map(|(name, class)| {
                let budgets = settings
                    .budgets
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.classes.is_empty() || b.classes.iter().any(|c| c == name))
                    .map(|(i, _)| i)
                    .collect();
                (
                    class.priority,
                    Class {
                        name: name.as_str().into(),
                        patterns: class
                            .paths
                            .iter()
                            .flat_map(|p| target::pattern_forms(p, settings.case_insensitive_paths))
                            .map(|p| Pattern::new(&p))
                            .collect(),
                        pattern_text: class.paths.clone(),
                        methods: class.methods.clone(),
                        fail: class.fail,
                        shadow: class.shadow,
                        budgets,
                        metrics: Arc::default(),
                    },
                )
            })
            .collect();
        classes.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let classes: Vec<Class> = classes.into_iter().map(|(_, c)| c).collect();
        let position = |name: &str| classes.iter().position(|c| &*c.name == name).unwrap_or(0);
        let (read, write) = (position("read"), position("write"));
        // `classes` is in priority order already: a stable sort keeps it among equals. Failing
        // closed is stricter; then a class with a budget per address on it (auth's `auth-ip`)
        // is stricter than one without (`messaging`, limited by recipient).
        let per_address = |class: &Class| {
            class
                .budgets
                .iter()
                .any(|&b| settings.budgets[b].scope == ScopeKind::EndpointIp)
        };
        let mut strictest_first: Vec<usize> = (0..classes.len()).collect();
        strictest_first
            .sort_by_key(|&i| (classes[i].fail == FailMode::Open, !per_address(&classes[i])));
        let first_segments = FirstSegments::new(classes.iter().map(|c| c.patterns.as_slice()));
        Self {
            first_segments,
            classes,
            budgets: settings.budgets.clone(),
            names: settings
                .budgets
                .iter()
                .map(|b| Arc::from(b.name.as_str()))
                .collect(),
            read,
            write,
            strictest_first,
            case_insensitive: settings.case_insensitive_paths,
            recent: ClassCache::new(),
        }
    }

    /// The class of a request: the first class whose pattern matches its canonical path
    /// ([`target::canonical`]); otherwise `read` for GET/HEAD and `write` for other methods.
    ///
    /// An ambiguous spelling is classified under each reading and gets the strictest of
    /// their classes ([`Budgets::stricter`]); a target that is not a valid path at all gets
    /// the strictest class there is (the HTTP edge refuses those with 400 before asking).
    pub fn classify(&self, method: &str, endpoint: &str) -> usize {
        if let Some(class) = self.recent.get(method, endpoint) {
            return class;
        }
        let class = self.classify_uncached(method, endpoint);
        self.recent.put(method, endpoint, class);
        class
    }

    fn classify_uncached(&self, method: &str, endpoint: &str) -> usize {
        match target::canonical(endpoint, self.case_insensitive) {
            Ok(target) => target
                .readings()
                .map(|path| self.classify_path(method, path))
                .reduce(|a, b| self.stricter(a, b))
                .unwrap_or(self.write),
            Err(_) => self.strictest_first[0],
        }
    }

    /// The class of a canonical path.
    fn classify_path(&self, method: &str, path: &str) -> usize {
        for index in self.first_segments.candidates(path) {
            let class = &self.classes[index];
            let method_ok = class.methods.is_empty()
                || class.methods.iter().any(|m| m.eq_ignore_ascii_case(method));
            if method_ok && class.patterns.iter().any(|p| p.matches(path)) {
                return index;
            }
        }
        if method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD") {
            self.read
        } else {
            self.write
        }
    }

    /// The stricter of two classes: one that fails closed is stricter than one that fails
    /// open; then one with a per-address budget (`endpoint_ip`) than one without; otherwise
    /// the one tried first (lower `priority`, then name).
    pub fn stricter(&self, a: usize, b: usize) -> usize {
        let rank = |class: usize| self.strictest_first.iter().position(|&c| c == class);
        if rank(b) < rank(a) { b } else { a }
    }

    /// The budgets that apply to a request of class `class` with the subjects `present`.
    pub fn applicable(&self, class: usize, present: Present) -> impl Iterator<Item = usize> + '_ {
        let authenticated = present.user;
        self.classes[class]
            .budgets
            .iter()
            .copied()
            .filter(move |&i| {
                let budget = &self.budgets[i];
                let when_ok = match budget.when {
                    When::Always => true,
                    When::Authenticated => authenticated,
                    When::Unauthenticated => !authenticated,
                };
                let subject_ok = match budget.scope {
                    ScopeKind::User | ScopeKind::EndpointUser => authenticated,
                    ScopeKind::Device | ScopeKind::IpDevice => present.device,
                    ScopeKind::Tenant => present.tenant,
                    ScopeKind::Recipient => present.recipient,
                    ScopeKind::Destination => present.destination,
                    ScopeKind::Global | ScopeKind::Ip | ScopeKind::EndpointIp => true,
                };
                when_ok && subject_ok
            })
    }

    /// Markdown table of every budget (the output of `palisade budgets`).
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| budget | scope | classes | applies to | limit | per | burst | refill/s | shadow |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for budget in &self.budgets {
            let classes = if budget.classes.is_empty() {
                "all".to_owned()
            } else {
                budget.classes.join(", ")
            };
            let when = match budget.when {
                When::Always => "every request",
                When::Authenticated => "with user_id",
                When::Unauthenticated => "without user_id",
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                budget.name,
                budget.scope.as_str(),
                classes,
                when,
                budget.limit,
                period(budget.period_s),
                budget.capacity(),
                trim_float(budget.refill_per_s()),
                if budget.shadow { "yes" } else { "no" },
            ));
        }
        out.push_str("\n| class | matches | on Redis failure | shadow |\n|---|---|---|---|\n");
        for class in &self.classes {
            let matches = if class.patterns.is_empty() {
                match &*class.name {
                    "read" => "GET/HEAD matching no other class".to_owned(),
                    "write" => "other methods matching no other class".to_owned(),
                    _ => "nothing (no patterns)".to_owned(),
                }
            } else {
                let methods = if class.methods.is_empty() {
                    String::new()
                } else {
                    format!("{} ", class.methods.join("/"))
                };
                format!(
                    "{methods}{}",
                    class
                        .pattern_text
                        .iter()
                        .map(|p| format!("`{p}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            let fail = match class.fail {
                FailMode::Open => "fail open (allow)",
                FailMode::Closed => "fail closed (503)",
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                class.name,
                matches,
                fail,
                if class.shadow { "yes" } else { "no" }
            ));
        }
        out
    }
}

fn period(seconds: u32) -> String {
    match seconds {
        1 => "second".to_owned(),
        60 => "minute".to_owned(),
        3600 => "hour".to_owned(),
        86400 => "day".to_owned(),
        s => format!("{s} s"),
    }
}

fn trim_float(value: f64) -> String {
    let text = format!("{value:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl Budgets {
    /// Every decision series of every class at zero from the start (a dashboard shows 0, not
    /// "no data", for a class that has not limited anything yet).
    pub fn zero_metrics(&self) {
        use crate::telemetry::metrics::{FAIL_OPEN_TOTAL, LIMIT_DECISIONS_TOTAL};
        for class in &self.classes {
            let name = class.name.to_string();
            let mut scopes: Vec<&'static str> = class
                .budgets
                .iter()
                .map(|&i| self.budgets[i].scope.as_str())
                .collect();
            scopes.sort_unstable();
            scopes.dedup();
            for scope in scopes {
                for outcome in ["allowed", "limited", "shadow_limited", "fail_open"] {
                    metrics::counter!(LIMIT_DECISIONS_TOTAL, "class" => name.clone(), "scope" => scope, "outcome" => outcome)
                        .increment(0);
                }
            }
            let outcome = match class.fail {
                crate::config::FailMode::Open => "fail_open",
                crate::config::FailMode::Closed => "fail_closed",
            };
            metrics::counter!(FAIL_OPEN_TOTAL, "class" => name.clone(), "outcome" => outcome)
                .increment(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_like_a_shell_star() {
        assert!(glob_match("/auth/*", "/auth/login"));
        assert!(glob_match("/auth/*", "/auth/"));
        assert!(!glob_match("/auth/*", "/authx"));
        assert!(glob_match("/token", "/token"));
        assert!(!glob_match("/token", "/tokens"));
        assert!(glob_match("*/search", "/v2/items/search"));
        assert!(glob_match("/a*b*c", "/aXbYc"));
        assert!(!glob_match("/a*b*c", "/aXcYb"));
        assert!(glob_match("*", ""));
    }

    #[test]
    fn requests_fall_back_to_read_and_write() {
        let budgets = Budgets::from_settings(&LimitSettings::default());
        let name = |m, p| budgets.classes[budgets.classify(m, p)].name.to_string();
        assert_eq!(name("POST", "/auth/login"), "auth");
        assert_eq!(name("POST", "/token?grant=x"), "auth");
        assert_eq!(name("GET", "/search?q=a"), "expensive");
        assert_eq!(name("GET", "/v1/feed"), "read");
        assert_eq!(name("HEAD", "/v1/feed"), "read");
        assert_eq!(name("DELETE", "/v1/feed/1"), "write");
    }

    #[test]
    fn spellings_of_a_class_path_keep_its_class() {
        let budgets = Budgets::from_settings(&LimitSettings::default());
        let name = |m, p| budgets.classes[budgets.classify(m, p)].name.to_string();
        for spelling in [
            "/Login",
            "/login/",
            "//login",
            "/%6cogin",
            "/login;jsessionid=1",
            "/./login",
            "/static/../login",
            "/oauth/token/",
            "/auth//login",
            "/AUTH/Login",
            "/auth/",
            "/auth",
            "/static/..;/login",
        ] {
            assert_eq!(name("POST", spelling), "auth", "{spelling}");
        }
        // Readings that servers disagree on: the strictest class of any reading.
        assert_eq!(name("POST", "/auth%2flogin"), "auth");
        assert_eq!(name("POST", "/x%2f..%2flogin"), "auth");
        assert_eq!(name("POST", "/%256cogin"), "auth");
        assert_eq!(name("POST", "/static\\..\\login"), "auth");
        // Not a path at all (the HTTP edge refuses it first): the strictest class.
        assert_eq!(name("GET", "/a\0b"), "auth");
        assert_eq!(name("GET", "no-slash"), "auth");
    }

    #[test]
    fn case_sensitive_matching_keeps_case() {
        let settings = LimitSettings {
            case_insensitive_paths: false,
            ..LimitSettings::default()
        };
        let budgets = Budgets::from_settings(&settings);
        let name = |m, p| budgets.classes[budgets.classify(m, p)].name.to_string();
        assert_eq!(name("POST", "/Login"), "write");
        assert_eq!(name("POST", "/login/"), "auth");
    }

    mod spellings {
        use super::*;
        use proptest::prelude::*;

        /// A concrete path of a pattern: each `*` becomes `fill`.
        fn instance(pattern: &str, fill: &str) -> String {
            pattern.replace('*', fill)
        }

        /// One way of spelling a segment separator or character that a lenient server
        /// reads as the same path.
        fn respell(path: &str, choices: &[u8]) -> String {
            let mut out = String::new();
            for (i, ch) in path.chars().enumerate() {
                let choice = choices.get(i % choices.len().max(1)).copied().unwrap_or(0);
                match (ch, choice % 12) {
                    ('/', 1) => out.push_str("//"),
                    ('/', 2) => out.push_str("/./"),
                    ('/', 3) => out.push_str("/zz/../"),
                    ('/', 4) if i > 0 => out.push_str(";p=1/"),
                    ('/', 5) if i > 0 => out.push_str("%2F"),
                    ('/', 6) if i > 0 => out.push('\\'),
                    ('/', 7) => out.push_str("/zz/..;/"),
                    (c, 8) if c.is_ascii_alphabetic() => out.push(c.to_ascii_uppercase()),
                    (c, 9) if c.is_ascii_alphanumeric() => {
                        out.push_str(&format!("%{:02x}", c as u32));
                    }
                    (c, 10) if c.is_ascii_alphanumeric() => {
                        out.push_str(&format!("%25{:02X}", c as u32));
                    }
                    (c, _) => out.push(c),
                }
            }
            if choices.first().is_some_and(|c| c % 2 == 1) {
                out.push('/');
            }
            // A tail servers strip before routing: a format suffix, dots, whitespace.
            let tails = ["", ".json", ".", "%20", " ", ".xml.", "%C2%A0", ".JSON"];
            out.push_str(tails[usize::from(choices.last().copied().unwrap_or(0)) % tails.len()]);
            // Sometimes a query with raw UTF-8, which plays no part.
            if choices.len() > 3 && choices[3].is_multiple_of(3) {
                out.push_str("?q=\u{e9}\u{1f600}");
            }
            out
        }

        proptest! {
            /// For generated spellings of every configured pattern, the class of the spelling
            /// is at least as strict as the class of its canonical form.
            #[test]
            fn a_spelling_is_never_in_a_laxer_class(
                fill in "[a-z0-9]{1,6}(/[a-z0-9]{1,6}){0,2}",
                choices in proptest::collection::vec(any::<u8>(), 1..24),
                method in prop::sample::select(vec!["GET", "POST", "PUT", "DELETE"]),
            ) {
                let budgets = Budgets::from_settings(&LimitSettings::default());
                let patterns: Vec<String> = LimitSettings::default()
                    .classes
                    .values()
                    .flat_map(|c| c.paths.clone())
                    .collect();
                for pattern in &patterns {
                    let plain = instance(pattern, &fill);
                    let spelled = respell(&plain, &choices);
                    let canonical = budgets.classify(method, &plain);
                    let class = budgets.classify(method, &spelled);
                    prop_assert_eq!(
                        budgets.stricter(class, canonical),
                        class,
                        "{} is {} but {} is {}",
                        spelled,
                        budgets.classes[class].name,
                        plain,
                        budgets.classes[canonical].name
                    );
                }
            }
        }
    }

    /// The class cache answers what classifying answers, for repeated and unique paths,
    /// whatever evicts what.
    #[test]
    fn cached_classes_are_the_classes() {
        let budgets = Budgets::from_settings(&LimitSettings::default());
        let mut requests: Vec<(String, String)> = Vec::new();
        for i in 0..2000 {
            let method = ["GET", "POST", "get", "DELETE"][i % 4];
            let endpoint = match i % 5 {
                0 => "/auth/login".to_owned(),
                1 => format!("/Auth/%6Cogin?x={i}"),
                2 => format!("/api/items/{i}/search"),
                3 => format!("/pay/{}", "x".repeat(i % 300)),
                _ => "/api/feed".to_owned(),
            };
            requests.push((method.to_owned(), endpoint));
        }
        for _ in 0..3 {
            for (method, endpoint) in &requests {
                assert_eq!(
                    budgets.classify(method, endpoint),
                    budgets.classify_uncached(method, endpoint),
                    "{method} {endpoint}"
                );
            }
        }
    }

    #[test]
    fn auth_class_gets_ip_account_global_budgets() {
        let budgets = Budgets::from_settings(&LimitSettings::default());
        let auth = budgets.classify("POST", "/auth/login");
        let names = |authenticated, device| -> Vec<String> {
            budgets
                .applicable(
                    auth,
                    Present {
                        user: authenticated,
                        device,
                        ..Present::default()
                    },
                )
                .map(|i| budgets.budgets[i].name.clone())
                .collect()
        };
        assert_eq!(
            names(true, false),
            vec!["global", "ip-authn", "auth-ip", "auth-account"]
        );
        assert_eq!(
            names(false, true),
            vec!["global", "ip-anon", "device", "auth-ip"]
        );
    }

    #[test]
    fn budgets_table_lists_every_budget_and_class() {
        let budgets = Budgets::from_settings(&LimitSettings::default());
        let table = budgets.markdown();
        for budget in &budgets.budgets {
            assert!(table.contains(&format!("`{}`", budget.name)));
        }
        assert!(table.contains("| `auth-account` | endpoint_user | auth | every request | 5 | minute | 5 | 0.0833 | no |"), "{table}");
    }
}
