//! The in-process check as a prediction needs it: the answer, the class and the deciding
//! scope, decided at once (no `.await`, no per-scope outcome built) by the same steps as
//! [`Limiter::check`].

use super::budgets::Budgets;
use super::request::{Error, LimitRequest, Verdict};

use super::{Limiter, Standing, affordable, deciding, settled};
use crate::store::Hot;

impl Limiter {
    /// [`Limiter::check`]'s verdict, decided at once; None when this limiter cannot decide
    /// without waiting or has something to note (the Redis store, a hook installed, decisions
    /// counted or recorded, the store being rebuilt): ask [`Limiter::check`] then.
    ///
    /// A policy replay asks this twice per recorded check; the same decision as `check` (a
    /// test compares the two on the same traffic).
    pub fn verdict_now(&self, request: &LimitRequest) -> Option<Result<Verdict, Error>> {
        let Hot::Memory(memory) = &self.hot else {
            return None;
        };
        let hooked = self.sockets.any();
        if hooked || self.observed || self.rebuilding.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let guard = self.budgets.load();
        let budgets: &Budgets = &guard;
        let class = budgets.classify(&request.method, &request.endpoint);
        let scopes = self.scopes(budgets, class, request, false);
        if let Err(err) = affordable(budgets, &scopes, request.cost) {
            return Some(Err(err));
        }
        let now_us = self.clock.monotonic_us();
        let outcomes = self.evaluate_memory(memory, &scopes, request, now_us);
        let standings: smallvec::SmallVec<[Standing; 8]> = settled(&scopes, &outcomes, request)
            .map(|(scope, raw)| Standing {
                enforced: scope.enforced,
                allowed: raw.allowed,
                remaining: raw.remaining,
                limit: raw.limit,
                retry_after_ms: raw.reported_retry_after_ms(),
            })
            .collect();
        let (allowed, deciding) = deciding(&standings, |s| *s);
        Some(Ok(Verdict {
            allowed,
            class: budgets.classes[class].name.clone(),
            deciding: deciding.map(|i| (scopes[i].kind, scopes[i].reported_subject())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::LimitSettings;
    use crate::model::{ClientIp, SubjectKey};
    use crate::store::{Keys, MemoryHot};

    fn limiter(settings: &LimitSettings, clock: &ManualClock) -> Limiter {
        Limiter::new(
            settings,
            Hot::Memory(MemoryHot::new()),
            Keys::new("t"),
            Arc::new(clock.clone()),
        )
        .unobserved()
    }

    /// Mixed traffic (reads, writes, logins, costs above one, answers without consuming,
    /// shadow budgets) through two twins: one asked `check`, one `verdict_now`, every
    /// answer the same, refusals among them.
    #[tokio::test]
    async fn the_verdict_is_the_checks_answer() {
        let mut settings = LimitSettings::default();
        settings.budgets[1].shadow = true;
        for budget in &mut settings.budgets {
            budget.limit = (budget.limit / 4).max(2);
        }
        let clock = ManualClock::new(1_800_000_000_000);
        let (full, lean) = (limiter(&settings, &clock), limiter(&settings, &clock));
        let endpoints = [
            ("GET", "/api/feed"),
            ("POST", "/api/items"),
            ("POST", "/auth/login"),
            ("GET", "/healthz"),
        ];
        let (mut refused, mut invalid) = (0, 0);
        for i in 0..4000u32 {
            let client = (i * 7919) % 37;
            let (method, endpoint) = endpoints[i as usize % endpoints.len()];
            let request = LimitRequest {
                method: method.to_owned(),
                endpoint: endpoint.to_owned(),
                ip: ClientIp::parse(&format!("198.51.100.{}", client % 5), 64).unwrap(),
                user: (client % 3 != 0)
                    .then(|| SubjectKey::user(&format!("u{client}"), 64).unwrap()),
                device: (client % 2 == 0)
                    .then(|| SubjectKey::device(&format!("d{client}"), 64).unwrap()),
                tenant: None,
                recipient: None,
                cost: 1 + i % 3 + if i % 500 == 7 { 1_000_000 } else { 0 },
                consume: i % 11 != 0,
            };
            let expected = full.check(&request).await.map(|d| d.verdict());
            let got = lean.verdict_now(&request).expect("decided at once");
            match (&expected, &got) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "check {i}");
                    refused += u32::from(!a.allowed);
                }
                (Err(a), Err(b)) => {
                    assert_eq!(a.to_string(), b.to_string());
                    invalid += 1;
                }
                _ => panic!("check {i}: {expected:?} vs {got:?}"),
            }
            clock.advance(Duration::from_millis(u64::from(i % 7)));
        }
        assert!(refused > 100, "{refused} refused");
        assert!(invalid > 0);
    }

    #[test]
    fn a_limiter_that_counts_its_decisions_is_not_asked_at_once() {
        let clock = ManualClock::new(1_800_000_000_000);
        let observed = Limiter::new(
            &LimitSettings::default(),
            Hot::Memory(MemoryHot::new()),
            Keys::new("t"),
            Arc::new(clock.clone()),
        );
        let request = LimitRequest {
            method: "GET".to_owned(),
            endpoint: "/feed".to_owned(),
            ip: ClientIp::parse("192.0.2.1", 64).unwrap(),
            user: None,
            device: None,
            tenant: None,
            recipient: None,
            cost: 1,
            consume: true,
        };
        assert!(observed.verdict_now(&request).is_none());
        assert!(
            limiter(&LimitSettings::default(), &clock)
                .verdict_now(&request)
                .is_some()
        );
    }
}
