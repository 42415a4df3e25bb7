//! The RESP the pipe speaks: commands of bulk strings out; bulk strings, errors and `+OK` in.

use bytes::{Buf, Bytes, BytesMut};

use super::PipeError;

pub(super) fn bulk(out: &mut Vec<u8>, value: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(itoa::Buffer::new().format(value.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// One reply.
pub(super) enum Reply {
    Bulk(Bytes),
    Error(String),
    Ok,
}

pub(super) fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(itoa::Buffer::new().format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        bulk(out, arg);
    }
}

/// Redis' own bound on a bulk string (`proto-max-bulk-len`'s default): a longer length is
/// not a reply to wait for.
const MAX_BULK: usize = 512 * 1024 * 1024;

/// The next whole reply in `input`, taken from it; `None` until one has arrived.
pub(super) fn parse(input: &mut BytesMut) -> Result<Option<Reply>, PipeError> {
    let Some(end) = input.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if end == 0 {
        return Err(PipeError::new("an empty reply line from Redis"));
    }
    let line = &input[1..end];
    match input.first() {
        Some(b'$') => {
            let len = std::str::from_utf8(line)
                .ok()
                .and_then(|n| n.parse::<i64>().ok())
                .ok_or_else(|| PipeError::new("a malformed bulk length from Redis"))?;
            if len < 0 {
                input.advance(end + 2);
                return Ok(Some(Reply::Error("a nil reply to a script call".into())));
            }
            let len = usize::try_from(len)
                .ok()
                .filter(|&len| len <= MAX_BULK)
                .ok_or_else(|| PipeError::new("a bulk length from Redis past its own limit"))?;
            let whole_len = end + 2 + len + 2;
            if input.len() < whole_len {
                return Ok(None);
            }
            let mut whole = input.split_to(whole_len).freeze();
            whole.advance(end + 2);
            whole.truncate(len);
            Ok(Some(Reply::Bulk(whole)))
        }
        Some(b'-') => {
            let message = String::from_utf8_lossy(line).into_owned();
            input.advance(end + 2);
            Ok(Some(Reply::Error(message)))
        }
        Some(b'+') => {
            input.advance(end + 2);
            Ok(Some(Reply::Ok))
        }
        _ => Err(PipeError::new("an unexpected reply type from Redis")),
    }
}
