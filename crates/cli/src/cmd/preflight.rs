//! One connection to every listed lender before the mount goes live. A lender that refuses
//! this mount's credentials — a certificate from another CA, another pre-shared key, a
//! certificate for another name, an unknown tenant or wrong secret, TLS on one side only — is
//! a configuration error: the mount stops at start, naming the lender, the problem and the
//! fix, instead of running with every read on the disk. A lender that is down, slow or busy is
//! only logged: the remote tier keeps trying, and reads go to the disk meanwhile.

use farcache_client::{ClientError, LenderAddr, LenderClient};
use farcache_engine::remote::RemoteConfig;

/// What a failed first connection means.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// The configuration cannot work with this lender: the fix, for the operator.
    Misconfigured(String),
    /// Down, unreachable, slow or busy: it may come up later.
    Unavailable,
}

fn judge(e: &ClientError, psk: bool) -> Verdict {
    let text = e.to_string();
    let same_key = "both sides must hold the same key (cache.tls_psk_file, server.tls_psk_file)";
    match e {
        ClientError::Tls(why) if why.contains("NotValidForName") || why.contains("not valid for name") => Verdict::Misconfigured(
            "the lender's certificate is not for the name dialled: set cache.tls_server_name (--tls-server-name) to \
             the name in its certificate, or make it one for this name (farcache certs --server-name)"
                .into(),
        ),
        ClientError::Tls(why) if why.contains("UnknownIssuer") || why.contains("BadSignature") => {
            Verdict::Misconfigured(if psk {
                format!("the lender holds another pre-shared key: {same_key}")
            } else {
                "the lender's certificate is not signed by cache.tls_ca (--tls-ca): point it at the CA that signed \
                 the lenders' certificates"
                    .into()
            })
        }
        ClientError::Tls(why) if why.contains("Expired") => Verdict::Misconfigured(
            "the lender's certificate has expired: give it a new one (farcache certs)".into(),
        ),
        ClientError::Tls(why) if why.contains("InvalidContentType") || why.contains("corrupt message") => {
            Verdict::Misconfigured(
                "the lender does not speak TLS: set server.tls_* on it, or drop the mount's --tls-* settings".into(),
            )
        }
        ClientError::Tls(_) => Verdict::Misconfigured("check both sides' TLS settings (docs/SECURITY.md)".into()),
        // TLS 1.3: the lender checks the client's certificate after the client's last flight,
        // so its refusal arrives as an alert on the first read.
        ClientError::Connect(_) | ClientError::Io(_) if text.contains("fatal alert") => {
            Verdict::Misconfigured(if psk {
                format!("the lender refused this mount's certificate: {same_key}")
            } else {
                "the lender refused this mount's certificate: it must be signed by the lender's \
                 server.tls_client_ca and unexpired"
                    .into()
            })
        }
        ClientError::AuthFailed(m) if m.contains("TLS required") => Verdict::Misconfigured(
            "the lender requires TLS: set cache.tls_ca/tls_cert/tls_key or cache.tls_psk_file as it expects".into(),
        ),
        ClientError::AuthFailed(_) => Verdict::Misconfigured(
            "set cache.tenant and cache.secret_file to a tenant the lender knows ([[server.tenant]]), or use \
             that tenant's certificate"
                .into(),
        ),
        ClientError::UnsupportedVersion(m) if m.contains("meta protocol") => Verdict::Misconfigured(
            "run memcached 1.6 or later there, or remove the memcached:// lender".into(),
        ),
        ClientError::UnsupportedVersion(_) | ClientError::Config(_) => {
            Verdict::Misconfigured("use farcache binaries of compatible versions".into())
        }
        _ => Verdict::Unavailable,
    }
}

/// Connect once to each lender in `rc` (at once, each within `connect_timeout`).
pub fn check_lenders(rc: &RemoteConfig) -> anyhow::Result<()> {
    if rc.servers.is_empty() {
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let psk = rc.tls.as_ref().is_some_and(|t| t.server_name.as_deref() == Some(farcache_tls::psk::PSK_SERVER_NAME));
    let results: Vec<(LenderAddr, Result<LenderClient, ClientError>)> = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for &a in &rc.servers {
            let cfg = rc.client_config(a);
            set.spawn(async move { (a, LenderClient::connect(a.protocol, cfg).await) });
        }
        let mut out = Vec::with_capacity(rc.servers.len());
        while let Some(r) = set.join_next().await {
            out.extend(r.ok());
        }
        out.sort_by_key(|(a, _)| rc.servers.iter().position(|s| s == a));
        out
    });
    for (addr, r) in results {
        match r {
            Ok(c) => c.close(),
            Err(e) => match judge(&e, psk) {
                Verdict::Misconfigured(fix) => {
                    anyhow::bail!("lender {addr}: {e}: {fix}")
                }
                Verdict::Unavailable => {
                    tracing::warn!(lender = %addr, "lender not reachable at start ({e}); its reads go to the disk until it is")
                }
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_configuration_errors_and_outages_are_not() {
        let io = |m: &str| std::io::Error::other(m.to_string());
        let mis = |e: ClientError, psk: bool| match judge(&e, psk) {
            Verdict::Misconfigured(fix) => fix,
            v => panic!("{e}: {v:?}"),
        };
        assert!(mis(ClientError::Tls("invalid peer certificate: UnknownIssuer".into()), false).contains("tls_ca"));
        assert!(mis(ClientError::Tls("invalid peer certificate: UnknownIssuer".into()), true).contains("same key"));
        assert!(mis(ClientError::Tls("invalid peer certificate: NotValidForName".into()), false)
            .contains("tls_server_name"));
        assert!(mis(ClientError::Connect(io("received fatal alert: DecryptError")), false).contains("tls_client_ca"));
        assert!(mis(ClientError::AuthFailed("TLS required: connect with TLS".into()), false).contains("requires TLS"));
        assert!(mis(ClientError::AuthFailed("unknown tenant or wrong secret".into()), false).contains("tenant"));
        for e in [
            ClientError::Connect(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            ClientError::Timeout,
            ClientError::Busy("too many connections".into()),
            ClientError::Closed,
        ] {
            assert_eq!(judge(&e, false), Verdict::Unavailable, "{e}");
        }
    }
}
