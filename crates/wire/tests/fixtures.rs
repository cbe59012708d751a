//! Byte fixtures: these pin the wire format of docs/PROTOCOL.md. Changing one of them is a
//! protocol change and needs a new protocol version.

use farcache_wire::*;

const LIMITS: Limits = Limits { max_frame_bytes: 1 << 20, max_batch: 256, max_value_bytes: 4096 };

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn one_frame(buf: &[u8]) -> (Header, &[u8]) {
    let (h, n) = split_frame(buf, LIMITS.max_frame_bytes).unwrap().expect("a whole frame");
    assert_eq!(n, buf.len(), "exactly one frame");
    (h, &buf[HEADER_BYTES..n])
}

#[test]
fn hello_bytes() {
    let mut out = Vec::new();
    encode_hello(&mut out, 7, &Hello { min_version: 1, max_version: 2, tenant: "db1", secret: b"pw" });
    let want = hex("1b000000 01 00 0000 0700000000000000 \
         46415243 0100 0200 03 646231 02 7077");
    assert_eq!(out, want);
    let (h, body) = one_frame(&out);
    assert_eq!(h.request_id, 7);
    assert_eq!(
        decode_request(&h, body, &Limits::HANDSHAKE).unwrap(),
        Request::Hello(Hello { min_version: 1, max_version: 2, tenant: "db1", secret: b"pw" })
    );
}

#[test]
fn hello_ok_bytes() {
    let ok = HelloOk {
        version: 1,
        flags: HELLO_OK_FLAG_ADMIN,
        max_frame_bytes: 0x0010_0000,
        max_batch: 256,
        max_inflight: 128,
        max_value_bytes: 4096,
        instance_id: 0x1122_3344_5566_7788,
    };
    let mut out = Vec::new();
    encode_hello_ok(&mut out, 7, &ok);
    let want = hex("24000000 81 00 0000 0700000000000000 \
         0100 0100 00001000 0001 8000 00100000 8877665544332211");
    assert_eq!(out, want);
    let (h, body) = one_frame(&out);
    assert_eq!(decode_response(&h, body, &LIMITS).unwrap(), Response::HelloOk(ok));
}

#[test]
fn get_bytes() {
    let key = Key::new(0x0102, 3, 4);
    let mut out = Vec::new();
    encode_keys(&mut out, Opcode::Get, 0x99, &[key]);
    let want = hex("30000000 02 00 0000 9900000000000000 \
         0100 0000 \
         02010000000000000000000000000000 0300000000000000 0400000000000000");
    assert_eq!(out, want);
    let (h, body) = one_frame(&out);
    match decode_request(&h, body, &LIMITS).unwrap() {
        Request::Get(keys) => assert_eq!(keys.iter().collect::<Vec<_>>(), vec![key]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn put_bytes() {
    let key = Key::new(1, 2, 3);
    let mut out = Vec::new();
    encode_put(&mut out, 1, &[(key, b"abc")]);
    let want = hex("37000000 03 00 0000 0100000000000000 \
         0100 0000 \
         01000000000000000000000000000000 0200000000000000 0300000000000000 \
         03000000 616263");
    assert_eq!(out, want);
    let (h, body) = one_frame(&out);
    match decode_request(&h, body, &LIMITS).unwrap() {
        Request::Put(list) => assert_eq!(list.iter().collect::<Vec<_>>(), vec![(key, &b"abc"[..])]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn values_bytes() {
    let mut out = Vec::new();
    let mut w = ValuesWriter::begin(&mut out, 5, 2);
    w.hit(&mut out, b"xy");
    w.miss(&mut out);
    w.finish(&mut out);
    let want = hex("18000000 82 00 0000 0500000000000000 0200 0000 01 02000000 7879 00");
    assert_eq!(out, want);
    let (h, body) = one_frame(&out);
    match decode_response(&h, body, &LIMITS).unwrap() {
        Response::Values(v) => assert_eq!(v.iter().collect::<Vec<_>>(), vec![Some(&b"xy"[..]), None]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn statuses_bytes() {
    let mut out = Vec::new();
    encode_statuses(&mut out, Opcode::PutOk, 2, &[0, 1, 2]);
    assert_eq!(out, hex("13000000 83 00 0000 0200000000000000 0300 0000 000102"));
    let (h, body) = one_frame(&out);
    match decode_response(&h, body, &LIMITS).unwrap() {
        Response::PutOk(s) => assert_eq!(s.as_slice(), &[0, 1, 2]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn error_bytes() {
    let mut out = Vec::new();
    encode_error(&mut out, 3, ErrorCode::AuthFailed, true, "no");
    assert_eq!(out, hex("12000000 ff 01 0000 0300000000000000 0400 0200 6e6f"));
    let (h, body) = one_frame(&out);
    assert_eq!(
        decode_response(&h, body, &LIMITS).unwrap(),
        Response::Error(ErrorFrame { code: ErrorCode::AuthFailed, fatal: true, message: "no" })
    );
}

#[test]
fn ping_stats_bytes() {
    let mut out = Vec::new();
    encode_raw(&mut out, Opcode::Ping, 4, b"hi");
    encode_raw(&mut out, Opcode::Stats, 5, b"");
    assert_eq!(out, hex("0e000000 06 00 0000 0400000000000000 6869 0c000000 05 00 0000 0500000000000000"));
    let (h, n) = split_frame(&out, 4096).unwrap().unwrap();
    assert_eq!(decode_request(&h, &out[HEADER_BYTES..n], &LIMITS).unwrap(), Request::Ping(b"hi"));
    let (h2, n2) = split_frame(&out[n..], 4096).unwrap().unwrap();
    assert_eq!(decode_request(&h2, &out[n + HEADER_BYTES..n + n2], &LIMITS).unwrap(), Request::Stats);
}

#[test]
fn oversized_length_prefix_is_refused_from_four_bytes() {
    // A 4 GiB length prefix is refused before any body byte arrives.
    assert_eq!(
        check_len_prefix(&hex("ffffffff"), 1 << 20),
        Err(WireError::TooLarge { len: 0xffff_ffff + 4, max: 1 << 20 })
    );
    assert_eq!(check_len_prefix(&hex("0b000000"), 1 << 20), Err(WireError::TooShort(11)));
    assert_eq!(check_len_prefix(&hex("0c00"), 1 << 20), Ok(None));
    assert_eq!(check_len_prefix(&hex("0c000000"), 1 << 20), Ok(Some(16)));
}

#[test]
fn malformed_bodies_name_the_problem() {
    let h = |op: u8, body: &[u8]| Header { opcode: op, flags: 0, request_id: 1, body_len: body.len() as u32 };
    let body = hex("0000 0000");
    assert!(matches!(decode_request(&h(2, &body), &body, &LIMITS), Err(WireError::BadField { field: "count", .. })));
    let body = hex("0200 0000 00");
    assert_eq!(decode_request(&h(2, &body), &body, &LIMITS), Err(WireError::Truncated("key batch")));
    let body = hex("0101 0000");
    assert_eq!(decode_request(&h(2, &body), &body, &LIMITS), Err(WireError::BatchTooLarge { count: 257, max: 256 }));
    let mut body = hex("0100 0000");
    body.extend_from_slice(&[0; 32]);
    body.extend_from_slice(&4097u32.to_le_bytes());
    assert_eq!(decode_request(&h(3, &body), &body, &LIMITS), Err(WireError::ValueTooLarge { len: 4097, max: 4096 }));
    assert_eq!(decode_request(&h(0x42, &[]), &[], &LIMITS), Err(WireError::UnknownOpcode(0x42)));
    let body = hex("58585858 0100 0100 01 61 00");
    assert_eq!(decode_request(&h(1, &body), &body, &LIMITS), Err(WireError::BadMagic(*b"XXXX")));
    let body = hex("46415243 0100 0100 01 2f 00");
    assert!(matches!(decode_request(&h(1, &body), &body, &LIMITS), Err(WireError::BadField { field: "tenant", .. })));
    let body = hex("01");
    assert_eq!(decode_request(&h(5, &body), &body, &LIMITS), Err(WireError::Trailing(1)));
    // A response opcode is not a request.
    assert_eq!(decode_request(&h(0x82, &[]), &[], &LIMITS), Err(WireError::UnknownOpcode(0x82)));
}
