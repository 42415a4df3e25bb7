use super::*;

fn parsed(bytes: &[u8]) -> Vec<String> {
    let mut input = BytesMut::from(bytes);
    let mut out = Vec::new();
    while let Some(reply) = parse(&mut input).unwrap() {
        out.push(match reply {
            Reply::Bulk(b) => format!("bulk {:?}", b),
            Reply::Error(e) => format!("error {e}"),
            Reply::Ok => "ok".into(),
        });
    }
    out
}

#[test]
fn replies_are_taken_whole_and_in_order() {
    assert_eq!(
        parsed(b"+OK\r\n$3\r\na\r\n\r\n-NOSCRIPT No matching script\r\n$0\r\n\r\n$5\r\nab"),
        [
            "ok",
            "bulk b\"a\\r\\n\"",
            "error NOSCRIPT No matching script",
            "bulk b\"\""
        ]
    );
    assert!(parse(&mut BytesMut::from(&b":1\r\n"[..])).is_err());
    assert!(parse(&mut BytesMut::from(&b"$x\r\n"[..])).is_err());
    // A misbehaving server gets a clear error, never a panic or a wrapped length.
    assert!(parse(&mut BytesMut::from(&b"\r\n+OK\r\n"[..])).is_err());
    assert!(parse(&mut BytesMut::from(&b"$9223372036854775807\r\nab"[..])).is_err());
    assert!(parse(&mut BytesMut::from(&b"$536870913\r\nab"[..])).is_err());
    assert!(matches!(
        parse(&mut BytesMut::from(&b"$536870912\r\nab"[..])),
        Ok(None)
    ));
}

#[test]
fn an_answer_is_split_by_its_parts_lengths() {
    let (a, ra) = oneshot::channel();
    let (b, rb) = oneshot::channel();
    let (c, mut rc) = oneshot::channel();
    answer_parts(
        vec![
            Waiter {
                reply_len: 2,
                tx: a,
            },
            Waiter {
                reply_len: 3,
                tx: b,
            },
            Waiter {
                reply_len: 4,
                tx: c,
            },
        ],
        Bytes::from_static(b"abcdef"),
    );
    assert_eq!(ra.blocking_recv().unwrap().unwrap(), &b"ab"[..]);
    assert_eq!(rb.blocking_recv().unwrap().unwrap(), &b"cde"[..]);
    // A short reply leaves the last part short: its caller's parse says so.
    assert_eq!(rc.try_recv().unwrap().unwrap(), &b"f"[..]);
}

#[test]
fn parts_are_written_as_resp_bulk_strings() {
    let mut part = Part::default();
    part.key(b"k1").key(b"").int(-12).arg(b"x\r\ny");
    assert_eq!(part.keys, b"$2\r\nk1\r\n$0\r\n\r\n");
    assert_eq!(part.args, b"$3\r\n-12\r\n$4\r\nx\r\ny\r\n");
    assert_eq!((part.key_count, part.arg_count), (2, 2));
}
