//! Reputation as a scoring signal: an IP's range classes (and its ASN's), and the manual
//! list entries by IP, CIDR and ASN, as factors.
//!
//! One factor for the range classes, the strictest class's: an address on both the
//! datacenter and the VPN list is not judged twice (X4BNet's datacenter list contains its
//! VPN list). On public classes (`scoring.public_classes`, default `auth`) the tighter
//! `reputation.public_factors` apply. Deny entries give 0 and allow entries pin at 1
//! (through [`super::lists::list_factors`], the same rule as for accounts and devices).

use std::sync::Arc;

use super::Reputation;
use super::lists::{Lists, list_factors};
use crate::config::ReputationSettings;
use crate::model::SubjectKind;
use crate::scoring::{Factor, Signal, Subject};

/// The reputation signal.
#[derive(Debug)]
pub struct ReputationSignal {
    reputation: Arc<Reputation>,
    lists: Arc<Lists>,
    settings: ReputationSettings,
    public_classes: Vec<String>,
}

impl ReputationSignal {
    /// The signal over the loaded data and the lists; `public_classes` get the public factors.
    pub fn new(
        reputation: Arc<Reputation>,
        lists: Arc<Lists>,
        settings: ReputationSettings,
        public_classes: Vec<String>,
    ) -> Self {
        Self {
            reputation,
            lists,
            settings,
            public_classes,
        }
    }

    /// One factor for `classes` (with the sources listing them), the strictest class's.
    fn class_factor(&self, classes: &[(String, Vec<String>)]) -> Option<Factor> {
        let (strictest, factor) = classes
            .iter()
            .map(|(class, _)| (class, self.settings.factor(class)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let public = classes
            .iter()
            .map(|(class, _)| self.settings.public_factor(class))
            .fold(f64::INFINITY, f64::min);
        let described: Vec<String> = classes
            .iter()
            .map(|(class, sources)| format!("{class} ({})", sources.join(", ")))
            .collect();
        let message = format!(
            "listed as {} (factor {factor}, {public} on {})",
            described.join("; "),
            self.public_classes.join(", ")
        );
        Some(
            Factor::scale(
                "reputation",
                &format!("reputation_{strictest}"),
                factor,
                message,
            )
            .with_class_value(&self.public_classes, public),
        )
    }
}

impl Signal for ReputationSignal {
    fn name(&self) -> &'static str {
        "reputation"
    }

    fn factors(&self, subject: &Subject<'_>, stored: &[Factor], now_ms: i64) -> Vec<Factor> {
        // Entries naming this subject exactly are stored by the lists (shared at once);
        // then they are not pulled a second time.
        let listed = stored.iter().any(|f| f.signal == "lists");
        match subject.key.kind() {
            SubjectKind::Ip => {
                let Some(ip) = subject.ip else {
                    return Vec::new();
                };
                let verdict = self.reputation.lookup(ip);
                let mut factors = Vec::new();
                if !verdict.classes.is_empty() {
                    let snapshot = self.reputation.snapshot();
                    let classes: Vec<(String, Vec<String>)> = verdict
                        .classes
                        .iter()
                        .map(|class| {
                            let sources = snapshot
                                .sources()
                                .iter()
                                .filter(|s| &s.class == class && verdict.sources.contains(&s.file))
                                .map(|s| s.file.clone())
                                .collect();
                            (class.clone(), sources)
                        })
                        .collect();
                    factors.extend(self.class_factor(&classes));
                }
                let mut entries = self.lists.ip_entries(verdict.ip, verdict.asn, now_ms);
                if listed {
                    entries.retain(|e| self.lists.subject(e).as_ref() != Some(subject.key));
                }
                let hits: Vec<&_> = entries.iter().collect();
                factors.extend(list_factors(&hits));
                factors
            }
            SubjectKind::Asn => {
                let Some(asn) = subject.key.asn_number() else {
                    return Vec::new();
                };
                let snapshot = self.reputation.snapshot();
                let mut classes: Vec<(String, Vec<String>)> = Vec::new();
                for (class, file) in snapshot.asn_classes(asn) {
                    match classes.iter_mut().find(|(c, _)| c == class) {
                        Some((_, files)) => files.push(file.to_owned()),
                        None => classes.push((class.to_owned(), vec![file.to_owned()])),
                    }
                }
                let mut factors: Vec<Factor> = self.class_factor(&classes).into_iter().collect();
                if !listed {
                    let entries = self.lists.asn_entries(asn, now_ms);
                    let hits: Vec<&_> = entries.iter().collect();
                    factors.extend(list_factors(&hits));
                }
                factors
            }
            _ => Vec::new(),
        }
    }
}
