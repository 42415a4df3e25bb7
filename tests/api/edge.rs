//! The HTTP edge itself, tried with raw sockets: slowloris and idle connections are closed,
//! oversized targets, headers and declared bodies are refused at once in the envelope.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{ADMIN_TOKEN, Backend, TestApp, assert_envelope};

async fn edge_app() -> TestApp {
    TestApp::spawn_with(Backend::Embedded, |settings| {
        settings.http.header_read_timeout_ms = 300;
    })
    .await
    .unwrap()
}

async fn connect(app: &TestApp) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection; returns what it sent and how long it took.
async fn until_closed(stream: &mut tokio::net::TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut received));
    read.await
        .expect("the server closes the connection within 5 s")
        .ok();
    (
        String::from_utf8_lossy(&received).into_owned(),
        started.elapsed(),
    )
}

/// Slowloris: headers trickle in and never end. The server drops the connection once
/// `http.header_read_timeout_ms` has passed, instead of holding it (and a task) forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let app = edge_app().await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: palisade\r\nX-Slow: ")
        .await
        .unwrap();
    let (_, took) = until_closed(&mut stream).await;
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
}

/// An idle kept-alive connection is closed after the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed() {
    let app = edge_app().await;
    let mut stream = connect(&app).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: palisade\r\n\r\n")
        .await
        .unwrap();
    let (received, took) = until_closed(&mut stream).await;
    assert!(received.starts_with("HTTP/1.1 200"), "{received}");
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
}

/// A body declared larger than `http.body_limit_bytes` is refused at once with 413 in the
/// envelope, without waiting for the body (what arrives of it is read and dropped, so a
/// client still sending reads the answer rather than a reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_is_413_at_once() {
    let app = edge_app().await;
    let mut stream = connect(&app).await;
    let request = format!(
        "POST /v1/events/auth HTTP/1.1\r\nHost: palisade\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n{{\"events\":["
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // The answer comes at once, while the body is still (not) on its way.
    let started = Instant::now();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&received).contains("\"request_id\"") {
        let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buffer))
            .await
            .expect("an answer within 2 s")
            .unwrap();
        assert!(n > 0, "closed before answering");
        received.extend_from_slice(&buffer[..n]);
    }
    let took = started.elapsed();
    let received = String::from_utf8_lossy(&received);
    assert!(received.starts_with("HTTP/1.1 413"), "{received}");
    assert!(received.contains("\"PAYLOAD_TOO_LARGE\""), "{received}");
    assert!(
        received.to_ascii_lowercase().contains("connection: close"),
        "{received}"
    );
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
}

/// Errors the server makes itself, not a handler, use the envelope too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_below_the_routes_use_the_envelope() {
    let app = edge_app().await;
    let long = format!("/healthz?{}", "q".repeat(9000));
    assert_envelope(
        app.get(&long, None).await,
        StatusCode::URI_TOO_LONG,
        "INVALID_ARGUMENT",
    )
    .await;
    let mut many = app.client.get(app.url("/healthz"));
    for i in 0..150 {
        many = many.header(format!("x-h{i}"), "v");
    }
    assert_envelope(
        many.send().await.unwrap(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "INVALID_ARGUMENT",
    )
    .await;
    let big = app
        .client
        .get(app.url("/healthz"))
        .header("x-big", "v".repeat(20_000))
        .send()
        .await
        .unwrap();
    assert_envelope(
        big,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "INVALID_ARGUMENT",
    )
    .await;
    assert_envelope(
        app.request(reqwest::Method::PUT, "/healthz", None, None)
            .await,
        StatusCode::METHOD_NOT_ALLOWED,
        "INVALID_ARGUMENT",
    )
    .await;
    assert_envelope(
        app.get("/nowhere", None).await,
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
    )
    .await;
    // What hyper refuses itself, before any handler: a target over its 64 KB, more headers
    // than it parses, a request line that is not HTTP. The envelope all the same.
    let huge = format!(
        "GET /healthz?{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "q".repeat(70_000)
    );
    let many: String = (0..300).map(|i| format!("x-h{i}: v\r\n")).collect();
    let many = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n");
    for (request, status) in [
        (huge, "HTTP/1.1 414 URI Too Long\r\n"),
        (many, "HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        (
            "GET /healthz HTTP/1.1\r\nHost x\r\n\r\n".to_owned(),
            "HTTP/1.1 400 Bad Request\r\n",
        ),
    ] {
        let mut stream = connect(&app).await;
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
            .await
            .unwrap();
        let (received, _) = until_closed(&mut stream).await;
        assert!(received.starts_with(status), "{received}");
        let (head, body) = received.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json"), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "INVALID_ARGUMENT", "{received}");
        let id = body["error"]["request_id"].as_str().unwrap();
        assert!(head.contains(&format!("x-request-id: {id}")), "{head}");
    }
    // The limit of headers is exact: 100 are answered, 101 are refused, in the envelope.
    for (extra, status) in [
        (98, "HTTP/1.1 200 OK\r\n"),
        (99, "HTTP/1.1 431 Request Header Fields Too Large\r\n"),
    ] {
        let headers: String = (0..extra).map(|i| format!("x-h{i}: v\r\n")).collect();
        let request =
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n");
        let mut stream = connect(&app).await;
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
            .await
            .unwrap();
        let (received, _) = until_closed(&mut stream).await;
        assert!(
            received.starts_with(status),
            "{extra} + 2 headers: {received}"
        );
        assert!(received.contains("x-request-id: "), "{received}");
    }
    // Still serving.
    assert_eq!(app.get("/healthz", None).await.status(), StatusCode::OK);
}
