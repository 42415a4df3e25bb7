//! What existing gateways call: forward-auth for nginx `auth_request`, Traefik ForwardAuth
//! and Caddy `forward_auth`, and CrowdSec's decisions stream for CrowdSec bouncers.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{authorize, bearer_token, parse_query};
use super::layer;
use super::limit::{LimitCheck, check_and_observe, parse, respond};
use crate::access::Role;
use crate::app::AppState;
use crate::integrations::crowdsec::{Decision, Filters, Lookup, Stream};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(forward_auth))
        .routes(routes!(crowdsec_stream))
        .routes(routes!(crowdsec_decisions))
}

/// `GET /v1/forward-auth` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ForwardAuthQuery {
    /// The limiter token, accepted here only with `forward_auth.query_token = true`.
    #[serde(default)]
    token: Option<String>,
    /// Status of a block: 429 (default; Traefik, Caddy) or 403 / 401 (nginx `auth_request`
    /// only understands 2xx, 401 and 403: map it back to 429 with `error_page`).
    #[serde(default)]
    #[param(schema_with = super::schema::deny_status)]
    deny_status: Option<u16>,
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// The first of `names` that the proxy sent (not blank), as bytes without surrounding
/// whitespace.
fn raw_header<'h>(headers: &'h HeaderMap, names: &[&str]) -> Option<&'h [u8]> {
    names.iter().find_map(|name| {
        let value = headers.get(*name)?.as_bytes().trim_ascii();
        (!value.is_empty()).then_some(value)
    })
}

/// An identity header as UTF-8 text (a user id from a JWT may hold any character); a value
/// that is not UTF-8 is a 400, not an anonymous caller.
fn identity_header(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    raw_header(headers, &[name])
        .map(|raw| {
            std::str::from_utf8(raw)
                .map(str::to_owned)
                .map_err(|_| ApiError::invalid(format!("{name} is not UTF-8 text")))
        })
        .transpose()
}

/// The original request's method: `X-Forwarded-Method` or `X-Original-Method`. Missing or
/// not a method token is a 400: a guess would pick a class the request may not have.
fn original_method(headers: &HeaderMap) -> Result<String, ApiError> {
    let names = ["x-forwarded-method", "x-original-method"];
    let raw = raw_header(headers, &names).ok_or_else(|| {
        ApiError::invalid(
            "forward-auth needs the original method: X-Forwarded-Method or X-Original-Method",
        )
    })?;
    axum::http::Method::from_bytes(raw)
        .map(|method| method.as_str().to_owned())
        .map_err(|_| ApiError::invalid("X-Forwarded-Method is not an HTTP method"))
}

/// The original request's target: `X-Forwarded-Uri` or `X-Original-URI`, read as the bytes
/// the proxy sent. Bytes outside ASCII (nginx passes `$request_uri` raw) are
/// percent-encoded, as a server reads them; an absolute URI keeps its path. Missing is a
/// 400, and anything that is not a path is refused by the canonical reading (also 400):
/// never the laxer class of `/`.
fn original_target(headers: &HeaderMap) -> Result<String, ApiError> {
    let names = ["x-forwarded-uri", "x-original-uri"];
    let raw = raw_header(headers, &names).ok_or_else(|| {
        ApiError::invalid(
            "forward-auth needs the original target: X-Forwarded-Uri or X-Original-URI",
        )
    })?;
    // The query and fragment play no part in classification.
    let end = raw
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(raw.len());
    let raw = &raw[..end];
    let mut target = String::with_capacity(raw.len());
    for &byte in raw {
        if byte.is_ascii() {
            target.push(char::from(byte));
        } else {
            target.push_str(&format!("%{byte:02X}"));
        }
    }
    if !target.starts_with('/')
        && let Some((_, rest)) = target.split_once("://")
    {
        // An absolute URI (some proxies send one): its path, or `/` when it has none.
        return Ok(rest.find('/').map_or("/", |at| &rest[at..]).to_owned());
    }
    Ok(target)
}

/// Forward-auth: may the original request pass? (role `limiter`)
///
/// For nginx `auth_request`, Traefik ForwardAuth and Caddy `forward_auth`. The original
/// request comes from `X-Forwarded-Method` / `X-Original-Method` and `X-Forwarded-Uri` /
/// `X-Original-URI` (both required; raw UTF-8 in the target is read as its escapes); the
/// client IP from `X-Forwarded-For` / `Forwarded` / `X-Real-IP`, believed
/// only from `trusted_proxies` (the right-most untrusted hop is the client); user and device
/// from the configured headers (`x-user-id`, `x-device-id`). 200 passes with the rate-limit
/// headers; a block is 429 (or `deny_status`) with `Retry-After` and the same headers.
#[utoipa::path(get, path = "/v1/forward-auth", tag = "gateways", security(("bearer" = [])),
    params(ForwardAuthQuery),
    responses((status = 200, description = "pass"), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope),
        (status = 429, body = Envelope), (status = 503, body = Envelope)))]
async fn forward_auth(
    State(app): State<AppState>,
    parts: Parts,
) -> Result<(StatusCode, HeaderMap), ApiError> {
    let (headers, uri) = (&parts.headers, &parts.uri);
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>();
    // The role is checked before the query is judged: a malformed query is a 400 only for
    // a caller allowed to ask.
    let query: Result<ForwardAuthQuery, ApiError> = parse_query(uri);
    let settings = &app.settings.forward_auth;
    let query_token = query.as_ref().ok().and_then(|q| q.token.as_deref());
    let token = match (bearer_token(&parts), query_token) {
        (Some(token), _) => Some(token),
        (None, Some(token)) if settings.query_token => Some(token),
        (None, Some(_)) => {
            return Err(ApiError::new(
                super::error::ErrorCode::Unauthenticated,
                "?token= is turned off (forward_auth.query_token); send Authorization: Bearer <token>",
            ));
        }
        (None, None) => None,
    };
    authorize(&app, token, Role::Limiter).await?;
    let query = query?;
    let deny_status = match query.deny_status {
        None | Some(429) => StatusCode::TOO_MANY_REQUESTS,
        Some(403) => StatusCode::FORBIDDEN,
        Some(401) => StatusCode::UNAUTHORIZED,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "deny_status {other} is not one of 429, 403, 401"
            )));
        }
    };
    let Some(ConnectInfo(peer)) = peer else {
        return Err(ApiError::invalid("the proxy's address is unknown"));
    };
    let client = layer::client_ip(peer.ip(), headers, &app.settings.trusted_proxies);
    let method = original_method(headers)?;
    let endpoint = original_target(headers)?;
    let check = LimitCheck {
        endpoint,
        method: Some(method),
        ip: client.to_string(),
        user_id: identity_header(headers, &settings.user_header)?,
        device_id: identity_header(headers, &settings.device_header)?,
        tenant: identity_header(headers, &settings.tenant_header)?,
        identity: identity_header(headers, crate::access::identity::HEADER)?,
        recipient: identity_header(headers, &settings.recipient_header)?,
        cost: None,
        consume: None,
    };
    let request = parse(&app, check)?;
    let decision = check_and_observe(&app, &request).await?;
    let outcome = if decision.allowed { "pass" } else { "block" };
    // Looked up once per outcome, not per request.
    static OUTCOMES: std::sync::LazyLock<
        crate::telemetry::metrics::Handles<&'static str, metrics::Counter>,
    > = std::sync::LazyLock::new(crate::telemetry::metrics::Handles::new);
    OUTCOMES.with(
        outcome,
        || metrics::counter!(crate::telemetry::metrics::FORWARD_AUTH_TOTAL, "outcome" => outcome),
        |counter| counter.increment(1),
    );
    match respond(&decision) {
        Ok((headers, _)) => Ok((StatusCode::OK, headers)),
        Err(blocked) if deny_status != StatusCode::TOO_MANY_REQUESTS => {
            Err(blocked.with_status(deny_status))
        }
        Err(blocked) => Err(blocked),
    }
}

/// `GET /crowdsec/v1/decisions/stream` query (other CrowdSec parameters are accepted and
/// ignored).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct StreamQuery {
    /// `true`: every live ban; `false` (default): changes since this bouncer's last pull.
    #[serde(default)]
    startup: Option<String>,
}

/// CrowdSec's decision filters, comma-separated and case-insensitive; absent: no filter.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct FilterQuery {
    /// Scopes to include: `ip`, `range`.
    #[serde(default)]
    scopes: Option<String>,
    /// Origins to include (Palisade's decisions have origin `palisade`).
    #[serde(default)]
    origins: Option<String>,
    /// Keep decisions whose scenario contains one of these words.
    #[serde(default)]
    scenarios_containing: Option<String>,
    /// Drop decisions whose scenario contains one of these words.
    #[serde(default)]
    scenarios_not_containing: Option<String>,
}

impl FilterQuery {
    fn filters(&self) -> Filters {
        Filters {
            scopes: Filters::list(self.scopes.as_deref()),
            origins: Filters::list(self.origins.as_deref()),
            scenarios_containing: Filters::list(self.scenarios_containing.as_deref()),
            scenarios_not_containing: Filters::list(self.scenarios_not_containing.as_deref()),
        }
    }
}

/// `GET /crowdsec/v1/decisions` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct DecisionsQuery {
    /// An address: the bans whose address or range holds it.
    #[serde(default)]
    ip: Option<String>,
    /// A CIDR: the bans whose range holds all of it.
    #[serde(default)]
    range: Option<String>,
    /// `ip` or `range`, with `value`.
    #[serde(default)]
    scope: Option<String>,
    /// A ban's address or CIDR as written.
    #[serde(default)]
    value: Option<String>,
}

/// CrowdSec LAPI live query of Palisade's IP bans (role `limiter`, token in `X-Api-Key`):
/// what a bouncer in live mode asks per request. `null` when nothing matches, as LAPI
/// answers.
#[utoipa::path(get, path = "/crowdsec/v1/decisions", tag = "gateways",
    params(DecisionsQuery, FilterQuery, ("X-Api-Key" = String, Header, description = "a limiter token")),
    responses((status = 200, body = Option<Vec<Decision>>), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn crowdsec_decisions(
    State(app): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<Option<Vec<Decision>>>, ApiError> {
    let token = header(&headers, "x-api-key");
    authorize(&app, token, Role::Limiter).await?;
    let query: DecisionsQuery = parse_query(&uri)?;
    let filters: FilterQuery = parse_query(&uri)?;
    let lookup = Lookup {
        ip: query
            .ip
            .as_deref()
            .map(|ip| {
                ip.trim()
                    .parse()
                    .map_err(|_| ApiError::invalid(format!("ip {ip:.64?} is not an IP address")))
            })
            .transpose()?,
        range: query
            .range
            .as_deref()
            .map(|range| {
                range
                    .trim()
                    .parse()
                    .map_err(|_| ApiError::invalid(format!("range {range:.64?} is not a CIDR")))
            })
            .transpose()?,
        scope: query.scope,
        value: query.value,
    };
    metrics::counter!(crate::telemetry::metrics::CROWDSEC_PULLS_TOTAL, "startup" => "live")
        .increment(1);
    let found = app.crowdsec.decisions(&lookup, &filters.filters()).await?;
    Ok(Json((!found.is_empty()).then_some(found)))
}

/// CrowdSec LAPI decisions stream of Palisade's IP bans (role `limiter`, token in
/// `X-Api-Key`).
///
/// Existing CrowdSec bouncers point their LAPI URL at `http://palisade/crowdsec/` with a
/// limiter token as API key. `new` holds bans to add, `deleted` bans to remove (deny-list
/// entries of kind `cidr`: scope `Ip` or `Range`, type `ban`, origin `palisade`).
#[utoipa::path(get, path = "/crowdsec/v1/decisions/stream", tag = "gateways",
    params(StreamQuery, FilterQuery, ("X-Api-Key" = String, Header, description = "a limiter token")),
    responses((status = 200, body = Stream), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn crowdsec_stream(
    State(app): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<Stream>, ApiError> {
    let token = header(&headers, "x-api-key");
    let caller = authorize(&app, token, Role::Limiter).await?;
    let query: StreamQuery = parse_query(&uri)?;
    let filters: FilterQuery = parse_query(&uri)?;
    let startup = match query.startup.as_deref() {
        None => false,
        Some(text) => text
            .parse::<bool>()
            .map_err(|_| ApiError::invalid(format!("startup {text:.16?} is not true or false")))?,
    };
    metrics::counter!(crate::telemetry::metrics::CROWDSEC_PULLS_TOTAL, "startup" => if startup { "true" } else { "false" })
        .increment(1);
    Ok(Json(
        app.crowdsec
            .pull(&caller.token_id, startup, &filters.filters())
            .await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As for the JSON check: the future every forward-auth request allocates stays small.
    #[test]
    fn a_forward_auth_future_stays_small() {
        let size = crate::api::future_size(|(state, parts)| forward_auth(state, parts));
        assert!(size < 4096, "a forward-auth future is {size} bytes");
    }
}
