//! Property tests: every encoder's output decodes to what went in, and no byte string makes
//! the decoders panic or read past their frame.

use farcache_wire::*;
use proptest::prelude::*;

const LIMITS: Limits = Limits { max_frame_bytes: 1 << 20, max_batch: 64, max_value_bytes: 4096 };

fn key() -> impl Strategy<Value = Key> {
    (any::<u128>(), any::<u64>(), any::<u64>()).prop_map(|(f, b, e)| Key::new(f, b, e))
}

fn decode_one(buf: &[u8]) -> (Header, &[u8]) {
    let (h, n) = split_frame(buf, LIMITS.max_frame_bytes).unwrap().unwrap();
    assert_eq!(n, buf.len());
    (h, &buf[HEADER_BYTES..])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn keys_roundtrip(id in any::<u64>(), keys in prop::collection::vec(key(), 1..64), del in any::<bool>()) {
        let op = if del { Opcode::Del } else { Opcode::Get };
        let mut out = Vec::new();
        encode_keys(&mut out, op, id, &keys);
        let (h, body) = decode_one(&out);
        prop_assert_eq!(h.request_id, id);
        let got = match decode_request(&h, body, &LIMITS).unwrap() {
            Request::Get(k) if !del => k.iter().collect::<Vec<_>>(),
            Request::Del(k) if del => k.iter().collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(got, keys);
    }

    #[test]
    fn puts_roundtrip(entries in prop::collection::vec((key(), prop::collection::vec(any::<u8>(), 0..200)), 1..16)) {
        let refs: Vec<(Key, &[u8])> = entries.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let mut out = Vec::new();
        encode_put(&mut out, 1, &refs);
        let (h, body) = decode_one(&out);
        match decode_request(&h, body, &LIMITS).unwrap() {
            Request::Put(list) => prop_assert_eq!(list.iter().collect::<Vec<_>>(), refs),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn values_roundtrip(vals in prop::collection::vec(prop::option::of(prop::collection::vec(any::<u8>(), 0..300)), 1..16)) {
        let mut out = Vec::new();
        let mut w = ValuesWriter::begin(&mut out, 9, vals.len());
        for v in &vals {
            match v { Some(v) => w.hit(&mut out, v), None => w.miss(&mut out) }
        }
        w.finish(&mut out);
        let (h, body) = decode_one(&out);
        match decode_response(&h, body, &LIMITS).unwrap() {
            Response::Values(list) => {
                let got: Vec<Option<Vec<u8>>> = list.iter().map(|v| v.map(|s| s.to_vec())).collect();
                prop_assert_eq!(got, vals);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Arbitrary bytes after a valid header never panic and never claim more than they hold.
    #[test]
    fn arbitrary_bodies_never_panic(op in any::<u8>(), flags in any::<u8>(), body in prop::collection::vec(any::<u8>(), 0..600)) {
        let h = Header { opcode: op, flags, request_id: 0, body_len: body.len() as u32 };
        if let Ok(req) = decode_request(&h, &body, &LIMITS) {
            match req {
                Request::Get(k) | Request::Del(k) => prop_assert!(k.len() * KEY_BYTES < body.len()),
                Request::Put(p) => { let n: usize = p.iter().map(|(_, v)| v.len()).sum(); prop_assert!(n < body.len()); }
                _ => {}
            }
        }
        if let Ok(Response::Values(v)) = decode_response(&h, &body, &LIMITS) {
            let n: usize = v.iter().map(|x| x.map_or(0, |s| s.len())).sum();
            prop_assert!(n < body.len());
        }
    }

    /// A byte stream of arbitrary frames splits without panics, and every split frame is within the limit.
    #[test]
    fn arbitrary_streams_split_safely(stream in prop::collection::vec(any::<u8>(), 0..2000)) {
        let mut rest = &stream[..];
        for _ in 0..100 {
            match split_frame(rest, 1024) {
                Ok(Some((h, n))) => {
                    prop_assert!((HEADER_BYTES..=1024).contains(&n));
                    let _ = decode_request(&h, &rest[HEADER_BYTES..n], &LIMITS);
                    rest = &rest[n..];
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
}
