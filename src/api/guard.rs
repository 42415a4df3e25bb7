//! The service-wide login guard and the networks blocked for spraying (role `analyst`).

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{Authorized, role};
use crate::app::AppState;
use crate::clock::rfc3339;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(login_guard))
        .routes(routes!(release_login_guard))
}

/// A network or ASN blocked on `auth` for spraying.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BlockedNetwork {
    /// `ip:…/24`, `ip:…/48` or `asn:…`.
    pub key: String,
    /// RFC 3339 end of the block (renewed while its spraying goes on).
    pub until: String,
}

/// The service-wide login guard and the blocked networks.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LoginGuardView {
    /// True while logins from contexts their accounts do not know get a login challenge on
    /// `auth`.
    pub active: bool,
    /// RFC 3339 end of the guard, while it is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_until: Option<String>,
    /// Failed logins (with logins stopped from unknown contexts, once per client) in the
    /// window, service-wide as of the last flush (at most 1 s old).
    pub failures: u64,
    /// Of them, those from contexts their accounts do not know: what the guard judges.
    pub unknown_failures: u64,
    /// Failures from unknown contexts in a window that turn the guard on now: at least
    /// `min_failures`, or `surge_factor` times the learned normal if that is more.
    pub threshold: u64,
    /// True once the normal for this hour of the day is learned: `threshold` turns the
    /// guard on whatever the failures' share of all logins.
    pub learned: bool,
    /// The learned normal count of failures from unknown contexts in one window, this hour
    /// of the day (UTC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normal: Option<f64>,
    /// `lockout.stuffing.surge_factor`.
    pub surge_factor: f64,
    /// Successful logins in the window.
    pub successes: u64,
    /// `lockout.stuffing`: the window, seconds.
    pub window_s: u64,
    /// `lockout.stuffing.min_failures` (0: the guard is off).
    pub min_failures: u64,
    /// `lockout.stuffing.failure_share`.
    pub failure_share: f64,
    /// `lockout.stuffing.hold_s`.
    pub hold_s: u64,
    /// RFC 3339 end of an analyst's release, while it lasts (the guard stays off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_until: Option<String>,
    /// Networks and ASNs blocked on `auth` for spraying from rotating addresses, soonest
    /// to end first.
    pub blocked_networks: Vec<BlockedNetwork>,
}

/// `POST /v1/login-guard/release` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseGuard {
    /// Why (1–500 characters; kept in the audit log).
    pub reason: String,
    /// How long it stays off whatever the window says, seconds, 1–86400 (default
    /// `lockout.stuffing.hold_s`, at most 86400).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86400)]
    pub for_s: Option<u64>,
}

/// Turns the login guard off for `for_s` on every instance (within a second), whatever
/// the window says: the failures are not an attack (an auth service reporting every login
/// as failed, a mass password reset). Role `analyst`; audited as `login_guard.release`.
#[utoipa::path(operation_id = "release_login_guard", post, path = "/v1/login-guard/release", tag = "scoring", security(("bearer" = [])),
    request_body = ReleaseGuard,
    responses((status = 200, body = LoginGuardView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn release_login_guard(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    super::extract::ApiJson(body): super::extract::ApiJson<ReleaseGuard>,
) -> Result<Json<LoginGuardView>, ApiError> {
    let reason = super::extract::parse_reason(Some(&body.reason))?;
    let for_s = body
        .for_s
        .unwrap_or(app.settings.lockout.stuffing.hold_s.min(86_400));
    if !(1..=86_400).contains(&for_s) {
        return Err(ApiError::invalid("for_s must be between 1 and 86400"));
    }
    let until = app
        .clock
        .now_ms()
        .saturating_add(i64::try_from(for_s * 1000).unwrap_or(i64::MAX));
    app.scoring.login_guard().release(until).await?;
    app.audit
        .record(
            &auth.caller.actor(),
            "login_guard.release",
            "global",
            serde_json::json!({ "reason": reason, "until": rfc3339(until) }),
            &super::request_id::current_request_id(),
        )
        .await?;
    tracing::warn!(until = %rfc3339(until), "login guard released by an analyst");
    Ok(Json(guard_view(&app)))
}

/// The login guard against credential stuffing, and the networks blocked for spraying
/// (role `analyst`).
#[utoipa::path(operation_id = "get_login_guard", get, path = "/v1/login-guard", tag = "scoring", security(("bearer" = [])),
    responses((status = 200, body = LoginGuardView),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn login_guard(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
) -> Json<LoginGuardView> {
    Json(guard_view(&app))
}

fn guard_view(app: &AppState) -> LoginGuardView {
    let guard = app.scoring.login_guard();
    let state = guard.state();
    let settings = &app.settings.lockout.stuffing;
    let now = app.clock.now_ms();
    let active = guard.is_active();
    let mut blocked = app.scoring.network_blocks().blocked();
    blocked.sort_by_key(|(key, until)| (*until, key.clone()));
    LoginGuardView {
        active,
        active_until: active.then(|| rfc3339(state.active_until_ms.max(now))),
        failures: state.failures,
        unknown_failures: state.unknown_failures,
        threshold: state.threshold,
        learned: state.learned,
        normal: state.normal,
        surge_factor: settings.surge_factor,
        successes: state.successes,
        window_s: settings.window_s,
        min_failures: settings.min_failures,
        failure_share: settings.failure_share,
        hold_s: settings.hold_s,
        released_until: (guard.released_until() > now).then(|| rfc3339(guard.released_until())),
        blocked_networks: blocked
            .into_iter()
            .map(|(key, until)| BlockedNetwork {
                key,
                until: rfc3339(until),
            })
            .collect(),
    }
}
