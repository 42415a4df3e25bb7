//! hyper's automatic answers in the error envelope.
//!
//! hyper answers a request it cannot parse itself, before any service runs: a request target
//! over 64 KB (`414`), more headers than allowed (`431`), a malformed request line (`400`).
//! It writes only a head (`connection: close`, `content-length: 0`) and has no hook for it. A
//! client of this API reads every refusal as the envelope, so the connection's writer
//! recognises exactly those heads and writes the same status with the envelope as its body.
//! Every other write passes through untouched; recognising costs a comparison of the first
//! bytes of each write.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::clock::Clock;

/// The heads hyper writes for its automatic answers, up to their `date` header.
const AUTOMATIC: [(&[u8], &str); 3] = [
    (
        b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\n",
        "the request target is too long for the server to read",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n",
        "the request's headers are too many or too large for the server to read",
    ),
    (
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n",
        "the request could not be read as HTTP",
    ),
];

/// A connection whose automatic answers are rewritten as envelopes.
pub(super) struct Enveloped<S> {
    inner: S,
    clock: Arc<dyn Clock>,
    /// A rewritten answer being written: its bytes, how many are written, and the length of
    /// hyper's own head to report once all are.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> Enveloped<S> {
    pub(super) fn new(inner: S, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner,
            clock,
            pending: None,
        }
    }
}

/// The envelope answer for hyper's head `written`, if it is one of its automatic answers
/// (the whole head in one write: hyper writes it so).
fn rewrite(written: &[u8], request_id: &str) -> Option<Vec<u8>> {
    let (head, message) = AUTOMATIC
        .iter()
        .find(|(head, _)| written.starts_with(head))?;
    let rest = &written[head.len()..];
    if !rest.ends_with(b"\r\n\r\n") {
        return None;
    }
    let status_line = &head[..head.iter().position(|&b| b == b'\r')?];
    let body = serde_json::json!({"error": {"code": "INVALID_ARGUMENT", "message": message,
                                            "request_id": request_id}})
    .to_string();
    let mut out = Vec::with_capacity(written.len() + body.len() + 96);
    out.extend_from_slice(status_line);
    out.extend_from_slice(b"\r\nconnection: close\r\ncontent-type: application/json\r\n");
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(format!("x-request-id: {request_id}\r\n").as_bytes());
    // The date header and the blank line hyper wrote.
    out.extend_from_slice(rest);
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

impl<S: AsyncWrite + Unpin> Enveloped<S> {
    /// Writes what is pending; Ready(Ok(n)) with hyper's length once all of it is written.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        while let Some((bytes, done, reported)) = &mut self.pending {
            if *done == bytes.len() {
                let reported = *reported;
                self.pending = None;
                return Poll::Ready(Ok(reported));
            }
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        Poll::Ready(Ok(0))
    }

    fn start(&mut self, written: &[u8]) -> bool {
        if written.len() < 12 || !written.starts_with(b"HTTP/1.1 4") {
            return false;
        }
        let id = self.clock.new_id().to_string();
        match rewrite(written, &id) {
            Some(bytes) => {
                self.pending = Some((bytes, 0, written.len()));
                true
            }
            None => false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Enveloped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Enveloped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.pending.is_some() || self.start(buf) {
            return self.poll_pending(cx);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let first = bufs.iter().find(|b| !b.is_empty()).map(|b| &**b);
        if self.pending.is_some() || first.is_some_and(|first| self.start(first)) {
            return self.poll_pending(cx);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.pending.is_some() {
            std::task::ready!(self.poll_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.pending.is_some() {
            std::task::ready!(self.poll_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_automatic_heads_are_rewritten() {
        let head = b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\ndate: Sun, 06 Dec 2026 22:13:16 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(head, "01ABC").unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{out}");
        let (headers, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(headers.contains("content-type: application/json"));
        assert!(headers.contains(&format!("content-length: {}", body.len())));
        assert!(headers.contains("date: Sun, 06 Dec 2026"));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "INVALID_ARGUMENT");
        assert_eq!(body["error"]["request_id"], "01ABC");
        // Our own answers (a body, other headers) and partial heads pass through.
        for other in [
            &b"HTTP/1.1 414 URI Too Long\r\ncontent-type: application/json\r\ncontent-length: 80\r\n\r\n"[..],
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            &b"HTTP/1.1 414 URI Too Long\r\nconnection: close\r\ncontent-length: 0\r\ndate: Sun"[..],
        ] {
            assert!(rewrite(other, "x").is_none(), "{}", String::from_utf8_lossy(other));
        }
    }
}
