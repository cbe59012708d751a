//! Just enough DER to read a certificate's `notAfter` and subject common name: rustls checks
//! validity during handshakes only, and farcache refuses an expired certificate at start.

use std::fmt;

use rustls::pki_types::CertificateDer;

/// A certificate time, in seconds since the Unix epoch (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CertTime(pub i64);

impl CertTime {
    pub fn now() -> CertTime {
        CertTime(crate::now_secs())
    }
}

impl fmt::Display for CertTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = self.0.div_euclid(86_400);
        let secs = self.0.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        write!(f, "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", secs / 3600, secs / 60 % 60, secs % 60)
    }
}

/// One TLV: tag, contents, and what follows.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&l0, rest) = rest.split_first()?;
    let (len, rest) = if l0 < 0x80 {
        (l0 as usize, rest)
    } else {
        let n = (l0 & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        (rest[..n].iter().fold(0usize, |a, &x| a << 8 | x as usize), &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;

/// The TBSCertificate's fields from `validity` on: (validity contents, the rest).
fn from_validity(cert: &[u8]) -> Option<(&[u8], &[u8])> {
    let (SEQUENCE, c, _) = tlv(cert)? else { return None };
    let (SEQUENCE, tbs, _) = tlv(c)? else { return None };
    let mut rest = tbs;
    let (tag, _, r) = tlv(rest)?;
    if tag == 0xa0 {
        rest = r; // explicit version
    }
    let (_serial, _, r) = tlv(rest)?;
    let (_sig_alg, _, r) = tlv(r)?;
    let (_issuer, _, r) = tlv(r)?;
    let (SEQUENCE, validity, r) = tlv(r)? else { return None };
    Some((validity, r))
}

/// The certificate's `notAfter`, or `None` when the DER cannot be read.
pub fn not_after(cert: &CertificateDer<'_>) -> Option<CertTime> {
    let (validity, _) = from_validity(cert.as_ref())?;
    let (_, _, r) = tlv(validity)?;
    let (tag, t, _) = tlv(r)?;
    parse_time(tag, t)
}

/// The first commonName of the certificate's subject, if it has one in UTF-8 or printable form.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, r) = from_validity(cert.as_ref())?;
    let (SEQUENCE, mut subject, _) = tlv(r)? else { return None };
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    while !subject.is_empty() {
        let (_set, mut rdn, next) = tlv(subject)?;
        subject = next;
        while !rdn.is_empty() {
            let (_, atv, next) = tlv(rdn)?;
            rdn = next;
            let (_oid_tag, oid, v) = tlv(atv)?;
            if oid == CN {
                let (_, value, _) = tlv(v)?;
                return String::from_utf8(value.to_vec()).ok();
            }
        }
    }
    None
}

fn digits(s: &[u8]) -> Option<i64> {
    s.iter().try_fold(0i64, |a, &c| c.is_ascii_digit().then(|| a * 10 + (c - b'0') as i64))
}

/// UTCTime (YYMMDDHHMMSSZ) or GeneralizedTime (YYYYMMDDHHMMSSZ).
fn parse_time(tag: u8, t: &[u8]) -> Option<CertTime> {
    let (year, rest) = match (tag, t.len()) {
        (0x17, 13) => {
            let yy = digits(&t[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &t[2..])
        }
        (0x18, 15) => (digits(&t[..4])?, &t[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let f = |i: usize| digits(&rest[i..i + 2]);
    let (mo, d, h, mi, s) = (f(0)?, f(2)?, f(4)?, f(6)?, f(8)?);
    Some(CertTime(days_from_civil(year, mo, d) * 86_400 + h * 3600 + mi * 60 + s))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(CertTime(1_700_000_000).to_string(), "2023-11-14 22:13:20 UTC");
        assert_eq!(parse_time(0x17, b"231114221320Z"), Some(CertTime(1_700_000_000)));
        assert_eq!(parse_time(0x18, b"20231114221320Z"), Some(CertTime(1_700_000_000)));
        assert_eq!(parse_time(0x18, b"2023111422132xZ"), None);
    }
}
