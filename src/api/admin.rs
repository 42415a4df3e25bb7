//! Admin routes: API tokens and the audit log (role `admin`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiJson, ApiPath, ApiQuery, Authorized, ReasonQuery, parse_reason, role};
use super::request_id::current_request_id;
use crate::access::{Role, TokenInfo};
use crate::app::AppState;
use crate::clock::rfc3339;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(revoke_token))
        .routes(routes!(list_audit))
}

/// `POST /v1/admin/tokens` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// `ingest`, `limiter`, `analyst` or `admin`.
    pub role: Role,
    /// A name unique among active tokens, 1–100 printable characters.
    #[schema(pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]{1,100}$")]
    pub name: String,
    /// Why the token is made, 1–500 characters (kept in the audit log).
    #[schema(min_length = 1, max_length = 500)]
    pub reason: String,
}

/// A newly created token. `token` is shown only here.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    /// Token id (for revoking).
    pub id: String,
    /// The bearer token; stored only as a hash, so it cannot be shown again.
    pub token: String,
    /// Name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// RFC 3339.
    pub created_at: String,
}

/// A token as listed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenView {
    /// Token id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// RFC 3339.
    pub created_at: String,
    /// Name of the token that created it.
    pub created_by: String,
    /// RFC 3339, if revoked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

impl From<TokenInfo> for TokenView {
    fn from(info: TokenInfo) -> Self {
        TokenView {
            id: info.id,
            name: info.name,
            role: info.role,
            created_at: rfc3339(info.created_at_ms),
            created_by: info.created_by,
            revoked_at: info.revoked_at_ms.map(rfc3339),
        }
    }
}

/// The token list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenList {
    /// Every token, newest first, revoked ones included.
    pub items: Vec<TokenView>,
}

/// Creates an API token (role `admin`). Audited as `token.create`.
#[utoipa::path(post, path = "/v1/admin/tokens", tag = "admin", security(("bearer" = [])),
    request_body = CreateToken,
    responses(
        (status = 201, body = CreatedToken),
        (status = 400, body = Envelope), (status = 401, body = Envelope),
        (status = 403, body = Envelope), (status = 409, body = Envelope),
    ))]
async fn create_token(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiJson(body): ApiJson<CreateToken>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    let reason = parse_reason(Some(&body.reason))?;
    let issued = app
        .access
        .create(body.role, &body.name, &auth.caller.name)
        .await?;
    app.audit
        .record(
            &auth.caller.actor(),
            "token.create",
            &issued.info.id,
            serde_json::json!({ "name": issued.info.name, "role": issued.info.role, "reason": reason }),
            &current_request_id(),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            id: issued.info.id,
            token: issued.secret,
            name: issued.info.name,
            role: issued.info.role,
            created_at: rfc3339(issued.info.created_at_ms),
        }),
    ))
}

/// Lists API tokens, never their secrets (role `admin`).
#[utoipa::path(get, path = "/v1/admin/tokens", tag = "admin", security(("bearer" = [])),
    responses((status = 200, body = TokenList), (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn list_tokens(
    _auth: Authorized<role::Admin>,
    State(app): State<AppState>,
) -> Result<Json<TokenList>, ApiError> {
    let items = app
        .access
        .list()
        .await?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(TokenList { items }))
}

/// Revokes an API token at once on this instance, within a second on the others (role
/// `admin`). Revoking a revoked token returns it unchanged. Audited as `token.revoke`.
#[utoipa::path(delete, path = "/v1/admin/tokens/{id}", tag = "admin", security(("bearer" = [])),
    params(("id" = String, Path, description = "token id"), ReasonQuery),
    responses(
        (status = 200, body = TokenView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope),
        (status = 404, body = Envelope), (status = 409, body = Envelope),
    ))]
async fn revoke_token(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ReasonQuery>,
) -> Result<Json<TokenView>, ApiError> {
    if id.len() > 64 {
        return Err(ApiError::not_found(format!("no token with id {id:.64}…")));
    }
    let reason = parse_reason(query.reason.as_deref())?;
    let (info, changed) = app.access.revoke(&id, &auth.caller.name).await?;
    if changed {
        app.audit
            .record(
                &auth.caller.actor(),
                "token.revoke",
                &info.id,
                serde_json::json!({ "name": info.name, "role": info.role, "reason": reason }),
                &current_request_id(),
            )
            .await?;
    }
    Ok(Json(info.into()))
}

/// `GET /v1/audit` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// Only this action, e.g. `token.create`.
    pub action: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$")]
    pub cursor: Option<String>,
    /// Page size, 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// Who acted.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ActorView {
    /// Token id.
    pub id: String,
    /// Token name.
    pub name: String,
    /// Token role.
    pub role: String,
}

/// One audit entry.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditEntryView {
    /// Entry id (ULID).
    pub id: String,
    /// RFC 3339.
    pub at: String,
    /// Who.
    pub actor: ActorView,
    /// What, e.g. `token.create`.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// Action-specific facts.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
    /// The request that did it.
    pub request_id: String,
}

/// A page of audit entries, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Entries.
    pub items: Vec<AuditEntryView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Who did what, when (role `analyst`; analysts review each other's actions), newest first.
#[utoipa::path(get, path = "/v1/audit", tag = "admin", security(("bearer" = [])),
    params(AuditParams),
    responses((status = 200, body = AuditPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn list_audit(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    let before = params
        .cursor
        .as_deref()
        .map(|cursor| {
            ulid::Ulid::from_string(cursor)
                .map_err(|_| ApiError::invalid("cursor is not a cursor returned by this API"))
        })
        .transpose()?;
    let limit = params.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 500"));
    }
    if params.action.as_ref().is_some_and(|a| a.len() > 64) {
        return Err(ApiError::invalid("action is longer than 64 characters"));
    }
    let page = app
        .audit
        .list(&crate::audit::Query {
            action: params.action,
            before,
            limit,
        })
        .await?;
    Ok(Json(AuditPage {
        items: page
            .items
            .into_iter()
            .map(|entry| AuditEntryView {
                id: entry.id,
                at: rfc3339(entry.at_ms),
                actor: ActorView {
                    id: entry.actor.id,
                    name: entry.actor.name,
                    role: entry.actor.role,
                },
                action: entry.action,
                target: entry.target,
                details: entry.details,
                request_id: entry.request_id,
            })
            .collect(),
        next_cursor: page.next_cursor,
    }))
}
