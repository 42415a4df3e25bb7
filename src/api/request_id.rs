//! Request ids: taken from `X-Request-Id` when the caller sent a sane one, else a new ULID.

use axum::http::HeaderMap;

/// The request-id header, in and out.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

tokio::task_local! {
    /// The id of the request this task is serving (set by the request middleware; handlers,
    /// extractors and error rendering run in the same task).
    static REQUEST_ID: String;
}

/// The caller's id if it is 1–64 characters of `[A-Za-z0-9._-]`, else a new ULID.
///
/// A bounded charset keeps ids safe to log and to echo in a header.
pub fn from_headers(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|id| {
            (1..=64).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
        .map_or_else(|| ulid::Ulid::new().to_string(), str::to_owned)
}

/// Runs `future` with `id` as the current request id.
pub async fn scope<F: Future>(id: String, future: F) -> F::Output {
    REQUEST_ID.scope(id, future).await
}

/// The current request's id, or a fresh ULID outside a request.
pub fn current_request_id() -> String {
    REQUEST_ID
        .try_with(Clone::clone)
        .unwrap_or_else(|_| ulid::Ulid::new().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn sane_ids_are_kept_and_others_replaced_by_ulids() {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID_HEADER, HeaderValue::from_static("abc-123.x_y"));
        assert_eq!(from_headers(&headers), "abc-123.x_y");
        headers.insert(REQUEST_ID_HEADER, HeaderValue::from_static("has space"));
        let generated = from_headers(&headers);
        assert!(ulid::Ulid::from_string(&generated).is_ok(), "{generated}");
        assert!(ulid::Ulid::from_string(&from_headers(&HeaderMap::new())).is_ok());
    }
}
