//! The lockout-DoS rule as the limiter asks it (its `Exemptions` socket): a locked
//! account's request from a context the account knows is checked without the lockout and
//! answered with a challenge; the contexts a login is known or noted by.

use std::sync::Arc;

use super::Lockouts;

/// The lockout-DoS rule as the limiter asks it: a locked account's request from a context
/// the account knows is checked without the lockout, and answered with a challenge.
#[derive(Debug)]
pub struct LockoutRule(Arc<Lockouts>);

impl crate::limiter::Exemptions for LockoutRule {
    fn exemption<'a>(
        &'a self,
        class: &'a str,
        request: &'a crate::limiter::LimitRequest,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<Option<crate::limiter::Challenge>, crate::store::Error>,
    > {
        Box::pin(async move {
            let Some(account) = &request.user else {
                return Ok(None);
            };
            let context = login_context(account, request);
            let exemption = self.0.exemption(&context, class).await.map_err(hot_error)?;
            Ok(exemption.map(|e| crate::limiter::Challenge {
                multiplier: e.multiplier,
                reason: crate::model::Reason::new(
                    "known_context",
                    "the account is locked, but it knows this context: ask for a step-up",
                ),
                lockout_id: Some(e.lockout_id),
                id: None,
            }))
        })
    }

    fn known_context<'a>(
        &'a self,
        request: &'a crate::limiter::LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>> {
        Box::pin(self.knows(request, true))
    }

    fn known_device<'a>(
        &'a self,
        request: &'a crate::limiter::LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<bool, crate::store::Error>> {
        Box::pin(self.knows(request, false))
    }

    fn refused_by_budget<'a>(
        &'a self,
        class: &'a str,
        request: &'a crate::limiter::LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<(), crate::store::Error>> {
        Box::pin(async move {
            let Some(account) = &request.user else {
                return Ok(());
            };
            let context = login_context(account, request);
            self.0
                .refused_by_budget(class, &context)
                .await
                .map_err(hot_error)
        })
    }

    fn unknown_context<'a>(
        &'a self,
        request: &'a crate::limiter::LimitRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<Option<String>, crate::store::Error>> {
        Box::pin(async move {
            let Some(account) = &request.user else {
                return Ok(None);
            };
            let context = login_context(account, request);
            self.0.unknown_context(&context).await.map_err(hot_error)
        })
    }
}

impl LockoutRule {
    /// The rule over `lockouts`.
    pub fn new(lockouts: Arc<Lockouts>) -> Self {
        Self(lockouts)
    }

    /// Whether the request's account knows its context (`by_address`: its address and
    /// network count too; else its device alone, or an attested one).
    async fn knows(
        &self,
        request: &crate::limiter::LimitRequest,
        by_address: bool,
    ) -> Result<bool, crate::store::Error> {
        let Some(account) = &request.user else {
            return Ok(false);
        };
        let context = login_context(account, request);
        let known = if by_address {
            self.0.knows(&context).await
        } else {
            self.0.knows_device(&context).await
        };
        known.map_err(hot_error)
    }
}

fn login_context(
    account: &crate::model::SubjectKey,
    request: &crate::limiter::LimitRequest,
) -> super::LoginContext {
    super::LoginContext {
        account: account.clone(),
        account_name: String::new(),
        ip: request.ip,
        ip_key: crate::model::SubjectKey::ip(&request.ip),
        device: request.device.clone(),
    }
}

/// A lockout error as the limiter's hot-store error.
fn hot_error(err: super::Error) -> crate::store::Error {
    match err {
        super::Error::Store(store) => store,
        other => crate::store::Error::Unavailable {
            store: "hot",
            source: other.to_string().into(),
        },
    }
}
