//! Lockouts for analysts (role `analyst`): list, inspect, release.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{
    ApiJson, ApiPath, ApiQuery, Authorized, parse_cursor, parse_limit, parse_since, role,
};
use super::request_id::current_request_id;
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::lockout::{Lockout, LockoutEvent, Query, Status};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_lockouts))
        .routes(routes!(bulk_release))
        .routes(routes!(retime_lockout))
        .routes(routes!(get_lockout))
        .routes(routes!(release_lockout))
}

/// A lockout.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutView {
    /// Id (ULID).
    pub id: String,
    /// Account.
    pub account: String,
    /// `account`.
    pub scope: String,
    /// Reason code.
    pub reason: String,
    /// Failures in the window when created.
    pub failures: u32,
    /// Escalation level.
    pub level: u32,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub locked_until: String,
    /// RFC 3339, if released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
    /// Who released it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_by: Option<String>,
    /// Why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_reason: Option<String>,
}

impl From<Lockout> for LockoutView {
    fn from(l: Lockout) -> Self {
        LockoutView {
            id: l.id,
            account: l.account,
            scope: l.scope,
            reason: l.reason,
            failures: l.failures,
            level: l.level,
            created_at: rfc3339(l.created_at_ms),
            locked_until: rfc3339(l.locked_until_ms),
            released_at: l.released_at_ms.map(rfc3339),
            released_by: l.released_by,
            release_reason: l.release_reason,
        }
    }
}

/// A page of lockouts, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutPage {
    /// Lockouts.
    pub items: Vec<LockoutView>,
    /// Pass as `cursor` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/lockouts` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// `active` (default), `released`, `expired` or `all`.
    #[param(inline)]
    pub status: Option<Status>,
    /// Only this account (matched by its canonical id).
    pub account: Option<String>,
    /// Only lockouts caused by a failure from this address or network (CIDR).
    #[param(schema_with = super::schema::ip_or_network)]
    pub ip: Option<String>,
    /// Only lockouts caused by a failure from an address of this ASN (`AS13335` or `13335`).
    #[param(pattern = "^(AS|as)?[0-9]{1,10}$")]
    pub asn: Option<String>,
    /// Only lockouts caused by a failure from this device.
    pub device_id: Option<String>,
    /// Only lockouts with this reason code (e.g. `account_failures`).
    pub reason: Option<String>,
    /// Only lockouts created at or after this RFC 3339 time.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Only lockouts created before this RFC 3339 time.
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$")]
    pub cursor: Option<String>,
    /// Page size 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// Which lockouts a search or a bulk release is about.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LockoutFilter {
    /// `active`, `released`, `expired` or `all` (a bulk release only releases active ones).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Only this account (matched by its canonical id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Only lockouts caused by a failure from this address or network (CIDR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Only lockouts caused by a failure from an address of this ASN (`AS13335` or `13335`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asn: Option<String>,
    /// Only lockouts caused by a failure from this device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Only lockouts with this reason code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Only lockouts created at or after this RFC 3339 time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Only lockouts created before this RFC 3339 time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

impl LockoutFilter {
    /// True when the filter names anything besides a status.
    fn narrows(&self) -> bool {
        self.account.is_some()
            || self.ip.is_some()
            || self.asn.is_some()
            || self.device_id.is_some()
            || self.reason.is_some()
            || self.since.is_some()
            || self.until.is_some()
    }

    /// The domain query of this filter, checked.
    fn query(&self, app: &AppState) -> Result<Query, ApiError> {
        let ids = app.settings.http.identifiers();
        // The canonical id: a search for `Alice@Example.com` finds `alice@example.com`.
        let account = self
            .account
            .as_deref()
            .map(|a| ids.account("account", a).map(std::borrow::Cow::into_owned))
            .transpose()
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        if let Some(device) = &self.device_id {
            ids.device_key(device)
                .map_err(|e| ApiError::invalid(e.to_string()))?;
        }
        if let Some(reason) = &self.reason
            && (reason.is_empty()
                || reason.len() > 64
                || !reason.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        {
            return Err(ApiError::invalid(
                "reason must be a reason code: 1-64 of a-z and _",
            ));
        }
        let since_ms = parse_since(self.since.as_deref())?;
        let until_ms = parse_time("until", self.until.as_deref())?;
        Ok(Query {
            status: self.status.unwrap_or_default(),
            account,
            ip: self.ip.as_deref().map(parse_network).transpose()?,
            asn: self.asn.as_deref().map(parse_asn).transpose()?,
            device_id: self.device_id.clone(),
            reason: self.reason.clone(),
            since_ms,
            until_ms,
            ..Default::default()
        })
    }
}

/// Lists lockouts, newest first, searched by account, address or network, device, reason
/// and creation time (role `analyst`). A network search looks at the failures that caused
/// each lockout; it may name at most 10,000 addresses seen in auth events.
#[utoipa::path(get, path = "/v1/lockouts", tag = "lockouts", security(("bearer" = [])), params(ListParams),
    responses((status = 200, body = LockoutPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn list_lockouts(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<LockoutPage>, ApiError> {
    let limit = parse_limit(params.limit, 100, 500)?;
    let before = parse_cursor(params.cursor.as_deref())?;
    let filter = LockoutFilter {
        status: params.status,
        account: params.account,
        ip: params.ip,
        asn: params.asn,
        device_id: params.device_id,
        reason: params.reason,
        since: params.since,
        until: params.until,
    };
    let query = Query {
        before,
        limit,
        ..filter.query(&app)?
    };
    let (items, next_cursor) = app.lockouts.list(&query).await?;
    Ok(Json(LockoutPage {
        items: items.into_iter().map(LockoutView::from).collect(),
        next_cursor,
    }))
}

/// `POST /v1/lockouts/release` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkRelease {
    /// Which active lockouts (at least one field besides `status`).
    pub filter: LockoutFilter,
    /// Why (1–500 characters; kept in each lockout and the audit log).
    #[schema(pattern = "^[^\\u0000]{1,500}$")]
    pub reason: String,
    /// Only answer which lockouts would be released (default false).
    #[serde(default)]
    pub dry_run: bool,
}

/// What a bulk release did (or, on a dry run, would do).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct BulkReleased {
    /// True when nothing was released.
    pub dry_run: bool,
    /// Lockouts released (or that would be).
    pub count: usize,
    /// True when more than 1,000 matched: only the newest 1,000 were taken; call again.
    pub truncated: bool,
    /// The lockouts released (or that would be), newest first.
    pub items: Vec<LockoutView>,
}

/// Lockouts one bulk release takes at most.
const BULK_MAX: usize = 1000;

/// Releases every active lockout matching a filter, each as a single release would be
/// (role `analyst`); `dry_run` answers which without releasing. Audited per lockout and
/// once for the whole (`lockout.bulk_release`). At most 1,000 per call (`truncated`).
#[utoipa::path(post, path = "/v1/lockouts/release", tag = "lockouts", security(("bearer" = [])),
    request_body = BulkRelease,
    responses((status = 200, body = BulkReleased), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn bulk_release(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<BulkRelease>,
) -> Result<Json<BulkReleased>, ApiError> {
    let reason = release_reason(&body.reason)?;
    if !body.filter.narrows() {
        return Err(ApiError::invalid(
            "filter must name an account, ip, asn, device_id, reason, since or until: \
             releasing every lockout is not a bulk action",
        ));
    }
    if body.filter.status.is_some_and(|s| s != Status::Active) {
        return Err(ApiError::invalid(
            "only active lockouts can be released: leave status out or set it to active",
        ));
    }
    let mut query = body.filter.query(&app)?;
    query.limit = 500;
    let mut matched = Vec::new();
    loop {
        let (items, next) = app.lockouts.list(&query).await?;
        matched.extend(items);
        match next {
            Some(cursor) if matched.len() <= BULK_MAX => {
                query.before = Some(
                    ulid::Ulid::from_string(&cursor)
                        .map_err(|_| ApiError::internal("lockout ids are ULIDs"))?,
                );
            }
            _ => break,
        }
    }
    let truncated = matched.len() > BULK_MAX;
    matched.truncate(BULK_MAX);
    if body.dry_run {
        return Ok(Json(BulkReleased {
            dry_run: true,
            count: matched.len(),
            truncated,
            items: matched.into_iter().map(LockoutView::from).collect(),
        }));
    }
    let actor = auth.caller.actor();
    let request_id = current_request_id();
    let mut released = Vec::with_capacity(matched.len());
    for lockout in matched {
        match app
            .lockouts
            .release(&lockout.id, reason, &actor, &request_id)
            .await
        {
            Ok(lockout) => released.push(lockout),
            // Released by someone else meanwhile: not this call's.
            Err(crate::lockout::Error::AlreadyReleased(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    app.audit
        .record(
            &actor,
            "lockout.bulk_release",
            &format!("{} lockouts", released.len()),
            serde_json::json!({
                "filter": body.filter,
                "reason": reason,
                "released": released.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(),
                "truncated": truncated,
            }),
            &request_id,
        )
        .await?;
    Ok(Json(BulkReleased {
        dry_run: false,
        count: released.len(),
        truncated,
        items: released.into_iter().map(LockoutView::from).collect(),
    }))
}

/// An address (`192.0.2.7`) or a network (`192.0.2.0/24`, `2001:db8::/48`).
pub(super) fn parse_network(text: &str) -> Result<ipnetwork::IpNetwork, ApiError> {
    let net: ipnetwork::IpNetwork = text.trim().parse().map_err(|_| {
        ApiError::invalid(format!(
            "ip {text:.64?} is not an IP address or a network in CIDR notation"
        ))
    })?;
    // An IPv4-mapped IPv6 address is stored as the IPv4 address it maps.
    if let ipnetwork::IpNetwork::V6(v6) = net
        && v6.prefix() == 128
        && let Some(v4) = v6.ip().to_ipv4_mapped()
    {
        return Ok(ipnetwork::IpNetwork::V4(v4.into()));
    }
    Ok(net)
}

/// An ASN as `AS13335` or `13335`.
pub(super) fn parse_asn(text: &str) -> Result<u32, ApiError> {
    let digits = text
        .strip_prefix("AS")
        .or_else(|| text.strip_prefix("as"))
        .unwrap_or(text);
    digits
        .parse::<u32>()
        .map_err(|_| ApiError::invalid(format!("asn {text:.32?} is not an ASN (AS13335 or 13335)")))
}

/// An optional RFC 3339 time parameter → Unix ms.
pub(super) fn parse_time(name: &str, value: Option<&str>) -> Result<Option<i64>, ApiError> {
    value
        .map(|s| {
            chrono::DateTime::parse_from_rfc3339(s)
                .map(|t| t.timestamp_millis())
                .map_err(|_| ApiError::invalid(format!("{name} must be an RFC 3339 time")))
        })
        .transpose()
}

fn release_reason(reason: &str) -> Result<&str, ApiError> {
    crate::model::free_text(reason, 500)
        .map_err(|problem| ApiError::invalid(format!("reason {problem}")))
}

/// An event that caused a lockout.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventView {
    /// The auth service's id.
    pub event_id: String,
    /// `login_failure` or `login_success`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Account (canonical id, as every search and lockout names it).
    pub account: String,
    /// The account as the auth service spelled it, when that differs from `account`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_received: Option<String>,
    /// IP.
    pub ip: String,
    /// Device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// RFC 3339.
    pub ts: String,
}

/// One lockout with its events.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutDetail {
    /// The lockout.
    #[serde(flatten)]
    pub lockout: LockoutView,
    /// The failure events that caused it (those still retained).
    pub events: Vec<EventView>,
}

fn lockout_id(id: &str) -> Result<(), ApiError> {
    ulid::Ulid::from_string(id)
        .map(|_| ())
        .map_err(|_| ApiError::not_found(format!("no lockout with id {id:.40?}")))
}

/// One lockout with the failure events that caused it (role `analyst`).
#[utoipa::path(get, path = "/v1/lockouts/{id}", tag = "lockouts", security(("bearer" = [])),
    params(("id" = String, Path, description = "lockout id")),
    responses((status = 200, body = LockoutDetail), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn get_lockout(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<LockoutDetail>, ApiError> {
    lockout_id(&id)?;
    let (lockout, events) = app.lockouts.get(&id).await?;
    Ok(Json(LockoutDetail {
        lockout: lockout.into(),
        events: events
            .into_iter()
            .map(|e: LockoutEvent| EventView {
                event_id: e.event_id,
                kind: e.kind,
                account: e.account,
                account_received: e.account_received,
                ip: e.ip,
                device_id: e.device_id,
                endpoint: e.endpoint,
                ts: rfc3339(e.ts_ms),
            })
            .collect(),
    }))
}

/// `POST /v1/lockouts/{id}/release` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// Why (1–500 characters; kept in the lockout and the audit log).
    #[schema(pattern = "^[^\\u0000]{1,500}$")]
    pub reason: String,
}

/// Releases a lockout at once on every instance (role `analyst`); audited.
#[utoipa::path(post, path = "/v1/lockouts/{id}/release", tag = "lockouts", security(("bearer" = [])),
    params(("id" = String, Path, description = "lockout id")), request_body = Release,
    responses((status = 200, body = LockoutView), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope), (status = 409, body = Envelope)))]
async fn release_lockout(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Release>,
) -> Result<Json<LockoutView>, ApiError> {
    lockout_id(&id)?;
    let reason = release_reason(&body.reason)?;
    let lockout = app
        .lockouts
        .release(&id, reason, &auth.caller.actor(), &current_request_id())
        .await?;
    Ok(Json(lockout.into()))
}

/// `PATCH /v1/lockouts/{id}` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Retime {
    /// The new end, RFC 3339: later extends the lockout, earlier shortens it (in the future,
    /// within 365 days; to end it now, release it).
    #[schema(format = DateTime)]
    pub locked_until: String,
    /// Why (1–500 characters; kept in the audit log).
    #[schema(pattern = "^[^\\u0000]{1,500}$")]
    pub reason: String,
}

/// Extends or shortens a lockout in force, at once on every instance (role `analyst`);
/// audited as `lockout.retime`. 409 when it is released or expired.
#[utoipa::path(patch, path = "/v1/lockouts/{id}", tag = "lockouts", security(("bearer" = [])),
    params(("id" = String, Path, description = "lockout id")), request_body = Retime,
    responses((status = 200, body = LockoutView), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope), (status = 409, body = Envelope)))]
async fn retime_lockout(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Retime>,
) -> Result<Json<LockoutView>, ApiError> {
    lockout_id(&id)?;
    let reason = release_reason(&body.reason)?;
    let until = parse_time("locked_until", Some(&body.locked_until))?
        .ok_or_else(|| ApiError::invalid("locked_until is required"))?;
    let now = app.clock.now_ms();
    if until <= now || until > now + 365 * 86_400_000 {
        return Err(ApiError::invalid(
            "locked_until must be in the future and within 365 days (release a lockout to end it now)",
        ));
    }
    let lockout = app
        .lockouts
        .retime(
            &id,
            until,
            reason,
            &auth.caller.actor(),
            &current_request_id(),
        )
        .await?;
    Ok(Json(lockout.into()))
}
