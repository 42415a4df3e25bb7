//! What analysts ask every day (role `analyst`): who is failing, what happened to one
//! account and why, and clearing a subject's penalties (what the limiter decided is in
//! `decisions`).

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiJson, ApiPath, ApiQuery, Authorized, parse_limit, role};
use super::lockouts::{parse_asn, parse_network, parse_time};
use super::request_id::current_request_id;
use crate::analyst::{FailingQuery, TimelineItem};
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::model::SubjectKey;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(failing))
        .routes(routes!(timeline))
        .routes(routes!(clear_penalties))
        .routes(routes!(export_account, erase_account))
        .routes(routes!(search_events))
}

const HOUR_MS: i64 = 3_600_000;

/// `GET /v1/accounts/failing` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FailingParams {
    /// Failures received at or after this RFC 3339 time (default: the last 24 hours).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Only failures from this address or network (CIDR): "which accounts did it attack?".
    #[param(schema_with = super::schema::ip_or_network)]
    pub ip: Option<String>,
    /// Only failures from an address of this ASN (`AS13335` or `13335`).
    #[param(pattern = "^(AS|as)?[0-9]{1,10}$")]
    pub asn: Option<String>,
    /// Only failures naming this device.
    pub device_id: Option<String>,
    /// `false`: only accounts not locked now ("failing but not yet locked"); `true`: only
    /// locked ones. Default: both.
    pub locked: Option<bool>,
    /// At most this many accounts, the most failures first: 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// An account with failed logins.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FailingView {
    /// Account (canonical id).
    pub account: String,
    /// Failures in the period matching the filter.
    pub failures: u32,
    /// Distinct addresses.
    pub ips: u32,
    /// Distinct devices.
    pub devices: u32,
    /// RFC 3339 of the first failure.
    pub first_at: String,
    /// RFC 3339 of the last failure.
    pub last_at: String,
    /// The lockout in force, if the account is locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout_id: Option<String>,
}

/// Accounts with failures.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FailingPage {
    /// The most failures first.
    pub items: Vec<FailingView>,
}

/// Accounts with failed logins since a time, the most failures first, searched by address
/// or network and device; locked or not yet locked (role `analyst`).
#[utoipa::path(operation_id = "failing_accounts", get, path = "/v1/accounts/failing", tag = "analyst", security(("bearer" = [])),
    params(FailingParams),
    responses((status = 200, body = FailingPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn failing(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<FailingParams>,
) -> Result<Json<FailingPage>, ApiError> {
    let limit = parse_limit(params.limit, 100, 500)?;
    let since_ms = parse_time("since", params.since.as_deref())?
        .unwrap_or_else(|| app.clock.now_ms() - 24 * HOUR_MS);
    if let Some(device) = &params.device_id {
        app.settings
            .http
            .identifiers()
            .device_key(device)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    let asn = params.asn.as_deref().map(parse_asn).transpose()?;
    let net = params.ip.as_deref().map(parse_network).transpose()?;
    let ips = app.lockouts.addresses_matching(net.as_ref(), asn).await?;
    let items = app
        .analyst
        .failing(&FailingQuery {
            since_ms,
            ips,
            device_id: params.device_id,
            locked: params.locked,
            limit,
        })
        .await?;
    Ok(Json(FailingPage {
        items: items
            .into_iter()
            .map(|f| FailingView {
                account: f.account,
                failures: f.failures,
                ips: f.ips,
                devices: f.devices,
                first_at: rfc3339(f.first_ms),
                last_at: rfc3339(f.last_ms),
                lockout_id: f.lockout_id,
            })
            .collect(),
    }))
}

/// `GET /v1/accounts/{account}/timeline` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TimelineParams {
    /// From this RFC 3339 time (default: 7 days before `until`).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Before this RFC 3339 time (default: now); pass `next_until` for older items.
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// About this many items, newest first: 1–1000 (default 200).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// One thing that happened to an account.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TimelineItemView {
    /// RFC 3339.
    pub at: String,
    /// `login_failure`, `login_success`, `lockout`, `release`, `alert.<kind>`, or an audited
    /// action (`penalty.clear`).
    pub kind: String,
    /// A sentence.
    pub summary: String,
    /// The event, lockout, alert or audit entry id.
    pub reference: String,
    /// The facts behind it.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// An account's timeline.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TimelinePage {
    /// The account (canonical id).
    pub account: String,
    /// Newest first.
    pub items: Vec<TimelineItemView>,
    /// Pass as `until` for older items; absent when there are none in the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_until: Option<String>,
}

/// An account's auth events, lockouts, releases, alerts and audited actions, newest first,
/// each with its reasons (role `analyst`).
#[utoipa::path(operation_id = "account_timeline", get, path = "/v1/accounts/{account}/timeline", tag = "analyst", security(("bearer" = [])),
    params(("account" = String, Path, description = "account name", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$"), TimelineParams),
    responses((status = 200, body = TimelinePage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn timeline(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(account): ApiPath<String>,
    ApiQuery(params): ApiQuery<TimelineParams>,
) -> Result<Json<TimelinePage>, ApiError> {
    let limit = parse_limit(params.limit, 200, 1000)?;
    let account = app
        .settings
        .http
        .identifiers()
        .account("account", &account)
        .map_err(|e| ApiError::invalid(e.to_string()))?
        .into_owned();
    let subject =
        SubjectKey::user(&account, usize::MAX).map_err(|e| ApiError::invalid(e.to_string()))?;
    // `until` is exclusive: one millisecond past now includes what happened just now.
    let until_ms =
        parse_time("until", params.until.as_deref())?.unwrap_or_else(|| app.clock.now_ms() + 1);
    let since_ms =
        parse_time("since", params.since.as_deref())?.unwrap_or(until_ms - 7 * 24 * HOUR_MS);
    if since_ms >= until_ms {
        return Err(ApiError::invalid("since must be before until"));
    }
    let timeline = app
        .analyst
        .timeline(&account, subject.as_str(), since_ms, until_ms, limit)
        .await?;
    Ok(Json(TimelinePage {
        account,
        items: timeline
            .items
            .into_iter()
            .map(|i: TimelineItem| TimelineItemView {
                at: rfc3339(i.at_ms),
                kind: i.kind,
                summary: i.summary,
                reference: i.reference,
                details: i.details,
            })
            .collect(),
        next_until: timeline.next_until_ms.map(rfc3339),
    }))
}

/// `POST /v1/penalties/clear` body: one of `account`, `ip`, `device_id`, and a reason.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearPenalties {
    /// An account.
    pub account: Option<String>,
    /// An address (its IPv6 prefix for an IPv6 client, as the limiter keys it).
    pub ip: Option<String>,
    /// A device.
    pub device_id: Option<String>,
    /// A messaging destination, as the limit check's explanations and the `otp_conversion`
    /// alert name it (`+44909`, `@example.com`) or as any recipient in it
    /// (`+44 909 876 5432`): lifts a collapsed conversion's tightening.
    pub destination: Option<String>,
    /// Why (1–500 characters; kept in the audit log).
    #[schema(pattern = "^[^\\u0000]{1,500}$")]
    pub reason: String,
}

/// What was cleared.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Cleared {
    /// The subject key (`user:…`, `ip:…`, `device:…`).
    pub subject: String,
    /// The factor ids removed (`velocity:login_failures`, `offender:repeat_offender`, …);
    /// its failure windows are cleared as well.
    pub cleared: Vec<String>,
}

/// Clears what the engine concluded from a subject's behaviour (failure and spraying
/// factors, anomaly and repeat-offender flags) and its failure windows, at once on every
/// instance (role `analyst`); audited as `penalty.clear`. An account's lockout is released
/// with `POST /v1/lockouts/{id}/release`; lists and reputation are edited where they live.
#[utoipa::path(post, path = "/v1/penalties/clear", tag = "analyst", security(("bearer" = [])),
    request_body = ClearPenalties,
    responses((status = 200, body = Cleared), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn clear_penalties(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<ClearPenalties>,
) -> Result<Json<Cleared>, ApiError> {
    let reason = super::extract::parse_reason(Some(&body.reason))?;
    let subject = match body.destination.as_deref() {
        Some(destination) => {
            if body.account.is_some() || body.ip.is_some() || body.device_id.is_some() {
                return Err(ApiError::invalid(
                    "name exactly one of account, ip, device_id and destination",
                ));
            }
            app.messaging
                .recipients()
                .destination(destination)
                .map_err(|e| ApiError::invalid(e.to_string()))?
        }
        None => super::extract::one_subject(
            &app,
            body.account.as_deref(),
            body.ip.as_deref(),
            body.device_id.as_deref(),
        )?,
    };
    let cleared = app
        .lockouts
        .clear_penalties(
            &subject,
            &reason,
            &auth.caller.actor(),
            &current_request_id(),
        )
        .await?;
    Ok(Json(Cleared {
        subject: subject.to_string(),
        cleared,
    }))
}

/// Everything stored about an account, for a data-subject access request (role `analyst`);
/// audited as `account.export`.
#[utoipa::path(get, path = "/v1/accounts/{account}/export", tag = "analyst", security(("bearer" = [])),
    params(("account" = String, Path, description = "account name", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")),
    responses((status = 200, body = Object), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn export_account(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(account): ApiPath<String>,
) -> Result<Json<crate::analyst::subject::Export>, ApiError> {
    let (account, subject) = account_subject(&app, &account)?;
    let export =
        crate::analyst::subject::export(&app.stores.durable, &account, subject.as_str()).await?;
    app.audit
        .record(
            &auth.caller.actor(),
            "account.export",
            subject.as_str(),
            serde_json::json!({
                "auth_events": export.auth_events.len(),
                "lockouts": export.lockouts.len(),
                "decision_history": export.decision_history.len(),
            }),
            &current_request_id(),
        )
        .await?;
    Ok(Json(export))
}

/// `POST /v1/accounts/{account}/erase` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Erase {
    /// Why (1–500 characters; kept in the audit log).
    #[schema(pattern = "^[^\\u0000]{1,500}$")]
    pub reason: String,
}

/// What an erasure did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErasedView {
    /// The pseudonym the audit log now names the account by.
    pub pseudonym: String,
    /// Rows deleted per kind, audit entries pseudonymised, list entries kept.
    #[schema(value_type = Object)]
    pub erased: crate::analyst::subject::Erased,
}

/// Erases everything stored about an account (data-subject erasure; role `admin`): its
/// auth events, lockouts, decision history, alerts and factors, and on the hot side its lock
/// marker, windows and known contexts, at once on every instance. Audit entries about it
/// keep only its pseudonym (`privacy.pseudonym_key`); allow/deny entries naming it are kept
/// and counted. Audited as `account.erase` under the pseudonym.
#[utoipa::path(post, path = "/v1/accounts/{account}/erase", tag = "admin", security(("bearer" = [])),
    params(("account" = String, Path, description = "account name", pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,256}$")),
    request_body = Erase,
    responses((status = 200, body = ErasedView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn erase_account(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiPath(account): ApiPath<String>,
    ApiJson(body): ApiJson<Erase>,
) -> Result<Json<ErasedView>, ApiError> {
    let reason = super::extract::parse_reason(Some(&body.reason))?;
    let (account, subject) = account_subject(&app, &account)?;
    let pseudonym = app.scoring.pseudonyms().of(&account);
    app.lockouts.forget(&subject).await?;
    let erased =
        crate::analyst::subject::erase(&app.stores.durable, &account, subject.as_str(), &pseudonym)
            .await?;
    app.audit
        .record(
            &auth.caller.actor(),
            "account.erase",
            &format!("user:{pseudonym}"),
            serde_json::json!({ "reason": reason, "erased": erased }),
            &current_request_id(),
        )
        .await?;
    Ok(Json(ErasedView { pseudonym, erased }))
}

/// An account name from a path: its canonical id and its subject key.
fn account_subject(app: &AppState, account: &str) -> Result<(String, SubjectKey), ApiError> {
    let account = app
        .settings
        .http
        .identifiers()
        .account("account", account)
        .map_err(|e| ApiError::invalid(e.to_string()))?
        .into_owned();
    let subject =
        SubjectKey::user(&account, usize::MAX).map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok((account, subject))
}

/// `GET /v1/events/auth` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventParams {
    /// Only this account (matched by its canonical id).
    pub account: Option<String>,
    /// Only from this address or network (CIDR).
    #[param(schema_with = super::schema::ip_or_network)]
    pub ip: Option<String>,
    /// Only from addresses of this ASN (`AS13335` or `13335`).
    #[param(pattern = "^(AS|as)?[0-9]{1,10}$")]
    pub asn: Option<String>,
    /// Only naming this device.
    pub device_id: Option<String>,
    /// `login_failure`, `login_success` or `challenge_passed`.
    #[serde(rename = "type")]
    #[param(
        rename = "type",
        pattern = "^(login_failure|login_success|challenge_passed)$"
    )]
    pub kind: Option<String>,
    /// Only events at or after this RFC 3339 time.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Only events before this RFC 3339 time.
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// A page of auth events, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventPage {
    /// Events.
    pub items: Vec<super::lockouts::EventView>,
    /// Pass as `cursor` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

fn event_cursor((ts, id): &(i64, String)) -> String {
    use base64::Engine as _;
    format!(
        "{ts}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
    )
}

fn parse_event_cursor(text: &str) -> Result<(i64, String), ApiError> {
    use base64::Engine as _;
    let invalid = || ApiError::invalid("cursor is not a cursor returned by this API");
    let (ts, id) = text.split_once('.').ok_or_else(invalid)?;
    let ts: i64 = ts.parse().map_err(|_| invalid())?;
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(invalid)?;
    Ok((ts, id))
}

/// Auth events searched by account, address or network, ASN, device, type and time, newest
/// first (role `analyst`).
#[utoipa::path(get, path = "/v1/events/auth", tag = "analyst", security(("bearer" = [])),
    params(EventParams),
    responses((status = 200, body = EventPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn search_events(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<EventParams>,
) -> Result<Json<EventPage>, ApiError> {
    let limit = parse_limit(params.limit, 100, 500)?;
    let ids = app.settings.http.identifiers();
    let account = params
        .account
        .as_deref()
        .map(|a| ids.account("account", a).map(std::borrow::Cow::into_owned))
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if let Some(kind) = &params.kind
        && !["login_failure", "login_success", "challenge_passed"].contains(&kind.as_str())
    {
        return Err(ApiError::invalid(
            "type must be login_failure, login_success or challenge_passed",
        ));
    }
    let asn = params.asn.as_deref().map(parse_asn).transpose()?;
    let net = params.ip.as_deref().map(parse_network).transpose()?;
    let ips = app.lockouts.addresses_matching(net.as_ref(), asn).await?;
    let (rows, next) = app
        .analyst
        .events(&crate::analyst::EventQuery {
            account,
            ips,
            device_id: params.device_id,
            kind: params.kind,
            since_ms: parse_time("since", params.since.as_deref())?,
            until_ms: parse_time("until", params.until.as_deref())?,
            after: params
                .cursor
                .as_deref()
                .map(parse_event_cursor)
                .transpose()?,
            limit,
        })
        .await?;
    Ok(Json(EventPage {
        items: rows
            .into_iter()
            .map(|e| super::lockouts::EventView {
                event_id: e.event_id,
                kind: e.kind,
                account: e.account,
                account_received: e.account_received,
                ip: e.ip,
                device_id: e.device_id,
                endpoint: e.endpoint,
                ts: rfc3339(e.ts),
            })
            .collect(),
        next_cursor: next.as_ref().map(event_cursor),
    }))
}
