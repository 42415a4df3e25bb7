//! The limiter as HTTP: rate-limit headers, the client-IP rule, and [`RateLimitLayer`].
//!
//! [`RateLimitLayer`] is a `tower::Layer` any axum service can put in front of its routes to
//! enforce the same buckets directly against Redis (or in-process).
//!
//! It lives in `api` because it speaks HTTP; the limiter itself does not. `/v1/limit/check`
//! and the middleware produce identical headers from the same [`Decision`].

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use ipnetwork::IpNetwork;

use crate::limiter::{Decision, Error, LimitRequest, Limiter};
use crate::model::ClientIp;

/// `X-Palisade-Degraded: redis-unavailable`: the decision was made without the hot store.
pub const DEGRADED_HEADER: &str = "x-palisade-degraded";
/// `X-Palisade-Shadow`: shadow budgets that would have blocked (comma-separated names).
pub const SHADOW_HEADER: &str = "x-palisade-shadow";
/// `X-Palisade-Challenge`: the request passes and the app should ask for a step-up.
///
/// `known_context` (the account is locked but knows this context: the lockout-DoS rule),
/// `login_guard`, `network_blocked` or `network_spraying` (a context the account does not
/// know, during stuffing or a network's spraying block or suspicion).
pub const CHALLENGE_HEADER: &str = "x-palisade-challenge";
/// `X-Palisade-Challenge-Id`: a login challenge's id, for the auth service's
/// `challenge_passed` event.
pub const CHALLENGE_ID_HEADER: &str = "x-palisade-challenge-id";

fn value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// [`value`] for text built for it: its buffer becomes the value, not copied.
fn shared_value(text: String) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// `Retry-After` in whole seconds, at least 1.
pub fn retry_after_seconds(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

/// Unix seconds at which the deciding bucket is full again.
pub fn reset_unix_s(decision: &Decision) -> i64 {
    let reset_ms = decision.deciding_scope().map_or(0, |s| s.reset_ms);
    let at_ms = decision
        .now_ms
        .saturating_add(i64::try_from(reset_ms).unwrap_or(i64::MAX));
    at_ms.div_euclid(1000) + i64::from(at_ms.rem_euclid(1000) > 0)
}

/// The rate-limit headers of a decision.
///
/// `X-RateLimit-Limit/Remaining/Reset` of the deciding scope, the IETF `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, every
/// scope in one header; a policy's quota `q` is what this client gets, its multiplier applied), `Retry-After` when denied, and the degraded/shadow markers.
pub fn headers(decision: &Decision) -> HeaderMap {
    // Names parsed once; numbers and the two lists written straight into their values with
    // `itoa` (this runs for every check; `fmt` cost twice as much).
    const LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
    const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
    const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
    const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
    const STATE: HeaderName = HeaderName::from_static("ratelimit");
    let mut headers = HeaderMap::with_capacity(8);
    if let Some(scope) = decision.deciding_scope() {
        headers.insert(LIMIT, HeaderValue::from(scope.limit));
        headers.insert(REMAINING, HeaderValue::from(scope.remaining));
        headers.insert(RESET, HeaderValue::from(reset_unix_s(decision)));
    }
    if !decision.scopes.is_empty() {
        let mut number = itoa::Buffer::new();
        let mut policy = String::with_capacity(48 * decision.scopes.len());
        let mut state = String::with_capacity(40 * decision.scopes.len());
        for (i, s) in decision.scopes.iter().enumerate() {
            if i > 0 {
                policy.push_str(", ");
                state.push_str(", ");
            }
            // The quota this client gets: the configured limit times its multiplier.
            let quota = (f64::from(s.policy.0) * s.multiplier + 1e-9).floor() as u64;
            for (list, [first, second]) in [
                (
                    &mut policy,
                    [("\";q=", quota), (";w=", u64::from(s.policy.1))],
                ),
                (
                    &mut state,
                    [("\";r=", s.remaining), (";t=", s.reset_ms.div_ceil(1000))],
                ),
            ] {
                list.push('"');
                list.push_str(&s.budget);
                list.push_str(first.0);
                list.push_str(number.format(first.1));
                list.push_str(second.0);
                list.push_str(number.format(second.1));
            }
        }
        headers.insert(POLICY, shared_value(policy));
        headers.insert(STATE, shared_value(state));
    }
    if !decision.allowed {
        headers.insert(
            header::RETRY_AFTER,
            value(&retry_after_seconds(decision.retry_after_ms).to_string()),
        );
    }
    if decision.degraded {
        headers.insert(
            DEGRADED_HEADER,
            HeaderValue::from_static("redis-unavailable"),
        );
    }
    if let Some(challenge) = &decision.challenge {
        headers.insert(CHALLENGE_HEADER, value(&challenge.reason.code));
        if let Some(id) = &challenge.id {
            headers.insert(CHALLENGE_ID_HEADER, value(id));
        }
    }
    if !decision.shadow_blocked.is_empty() {
        let names: Vec<&str> = decision
            .shadow_blocked
            .iter()
            .map(|&i| &*decision.scopes[i].budget)
            .collect();
        headers.insert(
            SHADOW_HEADER,
            value(&format!("would-block; budgets={}", names.join(","))),
        );
    }
    headers
}

/// The 429 envelope details of a denied decision.
pub fn denial_details(decision: &Decision) -> serde_json::Value {
    let scope = decision.deciding_scope();
    serde_json::json!({
        "retry_after_ms": decision.retry_after_ms,
        "reason": decision.reason_code(),
        "scope": scope.map(|s| s.scope.as_str()),
        "budget": scope.map(|s| &*s.budget),
        "limit": scope.map(|s| s.limit),
        "reset": reset_unix_s(decision),
        "class": decision.class,
    })
}

/// The client of a request: the peer, unless the peer is a trusted proxy.
///
/// Behind trusted proxies it is the right-most address in `X-Forwarded-For` (or `Forwarded:
/// for=`, then `X-Real-IP`) that is not a trusted proxy. A client can prepend anything to
/// these headers, so only hops added by trusted proxies are believed: walking from the right,
/// an entry that is not an address (`unknown`, `_hidden`, garbage, bytes that are not text)
/// ends the walk at the trusted hop that wrote it, so nothing the client put left of it can
/// win. IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`, a `[::]` listener's IPv4 peers)
/// are read as the IPv4 address they are, before every trust decision.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNetwork]) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(*ip));
    if !is_trusted(&peer) {
        return peer;
    }
    // Hops left to right; None for an entry that is not an address.
    let mut hops: Vec<Option<IpAddr>> = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        match value.to_str() {
            Ok(text) => hops.extend(text.split(',').map(|h| parse_hop(h.trim()))),
            Err(_) => hops.push(None),
        }
    }
    if hops.is_empty() {
        for value in headers.get_all(header::FORWARDED) {
            match value.to_str() {
                Ok(text) => hops.extend(text.split(',').map(|element| {
                    element
                        .split(';')
                        .find_map(|pair| {
                            let pair = pair.trim();
                            pair.get(..4)
                                .filter(|key| key.eq_ignore_ascii_case("for="))
                                .map(|_| &pair[4..])
                        })
                        .and_then(|v| parse_hop(v.trim_matches('"')))
                })),
                Err(_) => hops.push(None),
            }
        }
    }
    if hops.is_empty()
        && let Some(real) = headers.get("x-real-ip")
    {
        hops.push(real.to_str().ok().and_then(|v| parse_hop(v.trim())));
    }
    let mut client = peer;
    for hop in hops.into_iter().rev() {
        match hop {
            // Written by the trusted hop `client`, and not an address: that hop is all we know.
            None => return client,
            Some(ip) if is_trusted(&ip) => client = ip,
            Some(ip) => return ip,
        }
    }
    client
}

/// `1.2.3.4`, `1.2.3.4:80`, `[::1]:80`, `::1`.
fn parse_hop(text: &str) -> Option<IpAddr> {
    let ip = if let Ok(ip) = text.parse::<IpAddr>() {
        ip
    } else if let Ok(addr) = text.parse::<SocketAddr>() {
        addr.ip()
    } else {
        text.strip_prefix('[')
            .and_then(|t| t.split(']').next())
            .and_then(|t| t.parse().ok())?
    };
    Some(ip.to_canonical())
}

/// Who the protected service says the caller is: insert it as a request extension (from
/// your own authentication middleware, placed before the layer) to get user and device
/// budgets.
#[derive(Debug, Clone, Default)]
pub struct RateLimitIdentity {
    /// The authenticated user id.
    pub user_id: Option<String>,
    /// The device id.
    pub device_id: Option<String>,
    /// The tenant (the partner or app the request is made for).
    pub tenant: Option<String>,
}

/// Settings of the middleware.
#[derive(Debug, Clone)]
pub struct LayerConfig {
    /// Proxies whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNetwork>,
    /// IPv6 prefix length for IP keys.
    pub ipv6_prefix_len: u8,
    /// How user and device ids become canonical (`Settings::http.identifiers()`).
    pub ids: crate::model::Identifiers,
}

/// `tower::Layer` enforcing Palisade's buckets in front of any axum service.
///
/// Answers 429 with the error envelope, `Retry-After` and the rate-limit headers; adds the
/// headers to allowed responses too. Needs `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info`); without it every request counts as 0.0.0.0.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Arc<Limiter>,
    config: Arc<LayerConfig>,
}

impl RateLimitLayer {
    /// A layer over a limiter (e.g. `App::limiter` of a library user's own Palisade).
    pub fn new(limiter: Arc<Limiter>, config: LayerConfig) -> Self {
        Self {
            limiter,
            config: Arc::new(config),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            config: self.config.clone(),
        }
    }
}

/// The service made by [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
    config: Arc<LayerConfig>,
}

fn envelope(
    status: StatusCode,
    code: &str,
    message: &str,
    details: serde_json::Value,
    headers: HeaderMap,
    request_id: &str,
) -> Response<Body> {
    let body = serde_json::json!({
        "error": { "code": code, "message": message, "details": details, "request_id": request_id }
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().extend(headers);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(HeaderName::from_static("x-request-id"), value(request_id));
    response
}

impl<S, B> tower::Service<Request<B>> for RateLimit<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was polled ready serves this request (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        let config = self.config.clone();
        Box::pin(async move {
            let peer = request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
            let ip = client_ip(peer, request.headers(), &config.trusted_proxies);
            let identity = request
                .extensions()
                .get::<RateLimitIdentity>()
                .cloned()
                .unwrap_or_default();
            let request_id = request
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .filter(|v| v.len() <= 64)
                .map_or_else(|| ulid::Ulid::new().to_string(), str::to_owned);
            let check = LimitRequest {
                method: request.method().as_str().to_owned(),
                endpoint: request.uri().path().to_owned(),
                ip: ClientIp::new(ip, config.ipv6_prefix_len),
                user: identity
                    .user_id
                    .and_then(|id| config.ids.user_key("user_id", &id).ok()),
                device: identity
                    .device_id
                    .and_then(|id| config.ids.device_key(&id).ok()),
                tenant: identity
                    .tenant
                    .and_then(|id| config.ids.tenant_key(&id).ok()),
                recipient: None,
                cost: 1,
                consume: true,
            };
            match limiter.check(&check).await {
                Ok(decision) if decision.allowed => {
                    let mut response = inner.call(request).await?;
                    response.headers_mut().extend(headers(&decision));
                    Ok(response)
                }
                Ok(decision) => Ok(envelope(
                    StatusCode::TOO_MANY_REQUESTS,
                    "RATE_LIMITED",
                    "Too many requests",
                    denial_details(&decision),
                    headers(&decision),
                    &request_id,
                )),
                Err(Error::FailClosed { class, .. }) => {
                    let mut extra = HeaderMap::new();
                    extra.insert(
                        DEGRADED_HEADER,
                        HeaderValue::from_static("redis-unavailable"),
                    );
                    extra.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    Ok(envelope(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "UNAVAILABLE",
                        "rate limiter unavailable; this endpoint class fails closed",
                        serde_json::json!({ "class": class }),
                        extra,
                        &request_id,
                    ))
                }
                // A single request of cost 1 cannot exceed a validated capacity (≥ 1).
                Err(Error::CostAboveCapacity { .. }) => inner.call(request).await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted() -> Vec<IpNetwork> {
        vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ]
    }

    fn with(name: &'static str, v: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_static(v));
        headers
    }

    #[test]
    fn untrusted_peers_cannot_forge_their_address() {
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        let headers = with("x-forwarded-for", "1.1.1.1");
        assert_eq!(client_ip(peer, &headers, &trusted()), peer);
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        // The client prepended a fake address; the proxy chain appended the real one.
        let headers = with("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.1.2.3");
        assert_eq!(
            client_ip(peer, &headers, &trusted()),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn forwarded_and_x_real_ip_are_understood() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let headers = with(
            "forwarded",
            "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
        );
        assert_eq!(
            client_ip(peer, &headers, &trusted()),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
        let headers = with("x-real-ip", "192.0.2.77");
        assert_eq!(
            client_ip(peer, &headers, &trusted()),
            "192.0.2.77".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_ip(peer, &HeaderMap::new(), &trusted()), peer);
    }

    #[test]
    fn ipv4_mapped_peers_and_hops_are_their_ipv4_address() {
        // A proxy on 127.0.0.1 reaching a `[::]` listener is trusted as 127.0.0.1.
        let peer: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let headers = with("x-forwarded-for", "198.51.100.7");
        assert_eq!(
            client_ip(peer, &headers, &trusted()),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        // A mapped hop is trusted as the IPv4 proxy it is, and a mapped client is IPv4.
        let headers = with("x-forwarded-for", "::ffff:198.51.100.8, ::ffff:10.0.0.5");
        assert_eq!(
            client_ip(peer, &headers, &trusted()),
            "198.51.100.8".parse::<IpAddr>().unwrap()
        );
        // An untrusted mapped peer is its IPv4 address too.
        let peer: IpAddr = "::ffff:203.0.113.9".parse().unwrap();
        assert_eq!(
            client_ip(peer, &HeaderMap::new(), &trusted()),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn an_unreadable_hop_ends_the_walk_at_the_proxy_that_wrote_it() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        for forwarded in [
            "6.6.6.6, garbage",
            "6.6.6.6, unknown",
            "6.6.6.6, , 10.0.0.5",
            "6.6.6.6,",
            "6.6.6.6, 999.1.1.1",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert("x-forwarded-for", HeaderValue::from_str(forwarded).unwrap());
            let client = client_ip(peer, &headers, &trusted());
            assert_ne!(client, "6.6.6.6".parse::<IpAddr>().unwrap(), "{forwarded}");
        }
        let headers = with("x-forwarded-for", "6.6.6.6, garbage, 10.0.0.5");
        assert_eq!(
            client_ip(peer, &headers, &trusted()),
            "10.0.0.5".parse::<IpAddr>().unwrap(),
            "the proxy that wrote the garbage"
        );
        let headers = with("forwarded", "for=6.6.6.6, for=_hidden");
        assert_eq!(client_ip(peer, &headers, &trusted()), peer);
        // Bytes that are not text are not an address either.
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", HeaderValue::from_static("6.6.6.6"));
        headers.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"\xff1.2.3.4").unwrap(),
        );
        assert_eq!(client_ip(peer, &headers, &trusted()), peer);
    }
}
