//! Manual allow/deny lists (role `analyst`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope, ErrorCode};
use super::extract::{ApiJson, ApiPath, ApiQuery, Authorized, ReasonQuery, parse_reason, role};
use super::request_id::current_request_id;
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::reputation::lists::{Entry, EntryKind, Error, ListName};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_entries, add_entry))
        .routes(routes!(delete_entry))
}

/// An entry.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EntryView {
    /// Id (ULID).
    pub id: String,
    /// `allow` or `deny`.
    pub list: ListName,
    /// `cidr`, `asn`, `account` or `device`.
    pub kind: EntryKind,
    /// Normalised value.
    pub value: String,
    /// Why.
    pub reason: String,
    /// RFC 3339.
    pub created_at: String,
    /// Token name that added it.
    pub created_by: String,
    /// RFC 3339; absent = until deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl From<Entry> for EntryView {
    fn from(e: Entry) -> Self {
        EntryView {
            id: e.id,
            list: e.list,
            kind: e.kind,
            value: e.value,
            reason: e.reason,
            created_at: rfc3339(e.created_at_ms),
            created_by: e.created_by,
            expires_at: e.expires_at_ms.map(rfc3339),
        }
    }
}

/// The live entries of a list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EntryList {
    /// Entries, oldest first.
    pub items: Vec<EntryView>,
}

/// `POST /v1/lists/{list}` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewEntry {
    /// An IP or CIDR, `AS13335` or a number, an account or a device id.
    pub value: String,
    /// Inferred for IPs, CIDRs and `AS…`; required for accounts and devices.
    #[serde(default)]
    pub kind: Option<EntryKind>,
    /// Why (1–500 characters).
    pub reason: String,
    /// RFC 3339; absent = until deleted.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// Accept a CIDR broader than /8 (IPv4) or /16 (IPv6), in either list: allowed, it lifts
    /// reputation penalties, denied, it refuses a large part of the internet, so it is refused
    /// unless an admin forces it (audited). A deny entry this broad is enforced but never
    /// published to CrowdSec bouncers or edge exports.
    #[serde(default)]
    pub force: bool,
}

impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        match err {
            Error::Invalid(_) => ApiError::invalid(err.to_string()),
            Error::NotFound(_) => ApiError::new(ErrorCode::NotFound, err.to_string()),
            Error::Forbidden(_) => ApiError::new(ErrorCode::Forbidden, err.to_string()),
            Error::Store(store) => store.into(),
        }
    }
}

/// Live entries of the allow or deny list (role `analyst`).
#[utoipa::path(get, path = "/v1/lists/{list}", tag = "lists", security(("bearer" = [])),
    params(("list" = ListName, Path, description = "allow or deny")),
    responses((status = 200, body = EntryList), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn list_entries(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(list): ApiPath<ListName>,
) -> Result<Json<EntryList>, ApiError> {
    Ok(Json(EntryList {
        items: app
            .lists
            .entries(list)
            .into_iter()
            .map(EntryView::from)
            .collect(),
    }))
}

/// Adds an entry, applied at once on every instance (role `analyst`; a CIDR broader than /8
/// or /16 needs `force` and role `admin`); audited as `list.add`.
#[utoipa::path(post, path = "/v1/lists/{list}", tag = "lists", security(("bearer" = [])),
    params(("list" = ListName, Path, description = "allow or deny")), request_body = NewEntry,
    responses((status = 201, body = EntryView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn add_entry(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath(list): ApiPath<ListName>,
    ApiJson(body): ApiJson<NewEntry>,
) -> Result<(StatusCode, Json<EntryView>), ApiError> {
    let expires_at_ms = body
        .expires_at
        .as_deref()
        .map(|t| {
            chrono::DateTime::parse_from_rfc3339(t)
                .map(|t| t.timestamp_millis())
                .map_err(|_| ApiError::invalid("expires_at must be an RFC 3339 time"))
        })
        .transpose()?;
    let new = crate::reputation::lists::NewEntry {
        value: body.value,
        kind: body.kind,
        reason: body.reason,
        expires_at_ms,
        force: body.force,
    };
    let entry = app
        .lists
        .add(list, new, &auth.caller.actor(), &current_request_id())
        .await?;
    Ok((StatusCode::CREATED, Json(entry.into())))
}

/// Deletes an entry (role `analyst`); audited as `list.delete`.
#[utoipa::path(delete, path = "/v1/lists/{list}/{id}", tag = "lists", security(("bearer" = [])),
    params(("list" = ListName, Path, description = "allow or deny"), ("id" = String, Path, description = "entry id"), ReasonQuery),
    responses((status = 200, body = EntryView), (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 404, body = Envelope)))]
async fn delete_entry(
    auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiPath((list, id)): ApiPath<(ListName, String)>,
    ApiQuery(query): ApiQuery<ReasonQuery>,
) -> Result<Json<EntryView>, ApiError> {
    if id.len() > 64 {
        return Err(ApiError::not_found("no entry with that id"));
    }
    let reason = parse_reason(query.reason.as_deref())?;
    let entry = app
        .lists
        .delete(
            list,
            &id,
            &reason,
            &auth.caller.actor(),
            &current_request_id(),
        )
        .await?;
    Ok(Json(entry.into()))
}
