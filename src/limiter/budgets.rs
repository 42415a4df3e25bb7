//! Endpoint classes and budgets: which class a request is in, which budgets apply to it,
//! and the Markdown table `palisade budgets` prints.

use std::sync::Arc;

use crate::config::{BudgetSettings, FailMode, LimitSettings, ScopeKind, When};

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
}

/// A path pattern: `*` matches any run of characters (including `/`); everything else
/// literally. Split once at load, matched on every check without allocating.
#[derive(Debug, Clone)]
struct Pattern {
    /// The literal pieces between stars.
    pieces: Vec<String>,
}

impl Pattern {
    fn new(pattern: &str) -> Self {
        Self {
            pieces: pattern.split('*').map(str::to_owned).collect(),
        }
    }

    fn matches(&self, text: &str) -> bool {
        let Some((first, rest_pieces)) = self.pieces.split_first() else {
            return text.is_empty();
        };
        let Some(mut rest) = text.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest_pieces.split_last() else {
            return rest.is_empty();
        };
        for piece in middle {
            match rest.find(piece.as_str()) {
                Some(at) => rest = &rest[at + piece.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last.as_str())
    }
}

/// `*` matches any run of characters (including `/`); everything else literally.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    Pattern::new(pattern).matches(text)
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
                        patterns: class.paths.iter().map(|p| Pattern::new(p)).collect(),
                        pattern_text: class.paths.clone(),
                        methods: class.methods.clone(),
                        fail: class.fail,
                        shadow: class.shadow,
                        budgets,
                    },
                )
            })
            .collect();
        classes.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let classes: Vec<Class> = classes.into_iter().map(|(_, c)| c).collect();
        let position = |name: &str| classes.iter().position(|c| &*c.name == name).unwrap_or(0);
        let (read, write) = (position("read"), position("write"));
        Self {
            classes,
            budgets: settings.budgets.clone(),
            names: settings
                .budgets
                .iter()
                .map(|b| Arc::from(b.name.as_str()))
                .collect(),
            read,
            write,
        }
    }

    /// The class of a request: the first class whose pattern matches; otherwise `read` for
    /// GET/HEAD and `write` for other methods. The query string is ignored.
    pub fn classify(&self, method: &str, endpoint: &str) -> usize {
        let path = endpoint.split(['?', '#']).next().unwrap_or(endpoint);
        for (index, class) in self.classes.iter().enumerate() {
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

    /// The budgets that apply to a request of class `class`.
    pub fn applicable(
        &self,
        class: usize,
        authenticated: bool,
        has_device: bool,
    ) -> impl Iterator<Item = usize> + '_ {
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
                    ScopeKind::Device => has_device,
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
    fn auth_class_gets_ip_account_global_budgets() {
        let budgets = Budgets::from_settings(&LimitSettings::default());
        let auth = budgets.classify("POST", "/auth/login");
        let names = |authenticated, device| -> Vec<String> {
            budgets
                .applicable(auth, authenticated, device)
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
