//! Reputation lookups (role `limiter`) and data reload (role `admin`).

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{ApiPath, Authorized, role};
use super::request_id::current_request_id;
use crate::app::AppState;
use crate::model::Reason;
use crate::reputation::Source;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(reputation))
        .routes(routes!(reload))
}

/// The reputation of one IP.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReputationView {
    /// The address (IPv4-mapped IPv6 shown as IPv4).
    pub ip: String,
    /// Autonomous system number, if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asn: Option<u32>,
    /// Its organisation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_org: Option<String>,
    /// `datacenter`, `vpn`, `tor`, `proxy`, … (the folder or file names of the data dir).
    pub classes: Vec<String>,
    /// Every source file that lists it.
    pub sources: Vec<String>,
    /// The strictest class factor (1.0 when clean).
    pub multiplier: f64,
    /// One reason per class.
    pub reasons: Vec<Reason>,
}

/// `GET /v1/reputation/{ip}` path.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // a schema only: the handler parses the segment itself
struct IpPath {
    /// IPv4 or IPv6 address.
    #[param(schema_with = super::schema::ip)]
    ip: String,
}

/// IP/ASN reputation of an address (role `limiter` or `analyst`): classes, sources, ASN, multiplier.
#[utoipa::path(operation_id = "ip_reputation", get, path = "/v1/reputation/{ip}", tag = "reputation", security(("bearer" = [])),
    params(IpPath),
    responses((status = 200, body = ReputationView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn reputation(
    _auth: Authorized<role::Reader>,
    State(app): State<AppState>,
    ApiPath(ip): ApiPath<String>,
) -> Result<Json<ReputationView>, ApiError> {
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|_| ApiError::invalid(format!("{ip:.64?} is not an IPv4 or IPv6 address")))?;
    let mut verdict = app.reputation.lookup(ip);
    app.lists.apply(&mut verdict);
    Ok(Json(ReputationView {
        ip: verdict.ip.to_string(),
        asn: verdict.asn,
        as_org: verdict.as_org,
        classes: verdict.classes,
        sources: verdict.sources,
        multiplier: verdict.multiplier,
        reasons: verdict.reasons,
    }))
}

/// What a reload loaded.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Reloaded {
    /// Every source with its class and entry count.
    #[schema(value_type = Vec<Object>)]
    pub sources: Vec<Source>,
    /// Ranges over all range files.
    pub ranges: usize,
    /// Disjoint segments of the lookup table.
    pub segments: usize,
    /// ASN databases (`.mmdb`) loaded.
    pub asn_databases: usize,
    /// IP→ASN ranges loaded from CSV.
    pub asn_ranges: usize,
}

/// Re-reads range files and ASN databases and swaps them in atomically (role `admin`);
/// audited as `reputation.reload`. A broken file keeps the old data: 400 with
/// `details: {file, line, reason}`, audited as `reputation.reload_rejected`. SIGHUP does the
/// same.
#[utoipa::path(operation_id = "reload_data", post, path = "/v1/admin/reload", tag = "admin", security(("bearer" = [])),
    responses((status = 200, body = Reloaded), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope)))]
async fn reload(
    auth: Authorized<role::Admin>,
    State(app): State<AppState>,
) -> Result<Json<Reloaded>, ApiError> {
    let snapshot = match app.reputation.reload().await {
        Ok(snapshot) => snapshot,
        Err(err) => {
            let details = serde_json::to_value(&err).unwrap_or_default();
            app.audit
                .record(
                    &auth.caller.actor(),
                    "reputation.reload_rejected",
                    "data_dir",
                    details.clone(),
                    &current_request_id(),
                )
                .await?;
            return Err(ApiError::invalid(format!(
                "reload rejected, the previous data stays in force: {err}"
            ))
            .with_details(details));
        }
    };
    app.scoring.invalidate();
    let (asn_databases, asn_ranges) = snapshot.asn_databases();
    app.audit
        .record(
            &auth.caller.actor(),
            "reputation.reload",
            "data_dir",
            serde_json::json!({ "sources": snapshot.sources().len(), "ranges": snapshot.ranges }),
            &current_request_id(),
        )
        .await?;
    Ok(Json(Reloaded {
        sources: snapshot.sources().to_vec(),
        ranges: snapshot.ranges,
        segments: snapshot.segments(),
        asn_databases,
        asn_ranges,
    }))
}
