//! `farcache certs --out DIR`: everything a small deployment needs for TLS 1.3 with mutual
//! authentication — a CA, a server certificate and key (for every `--server-name`), and a
//! client certificate and key per `--client` (its common name; the lender can take the
//! tenant from it). Keys are written mode 600; nothing is ever overwritten.

use std::path::PathBuf;

use anyhow::Context;
use farcache_tls::certs::{write_new, Ca};

#[derive(clap::Args)]
pub struct Args {
    /// Directory to write into (created if missing); none of the files may exist yet.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A DNS name or IP address the lenders are reached by (repeat for several; default:
    /// localhost, 127.0.0.1 and ::1). Borrowers check it against cache.servers' hosts, or
    /// cache.tls_server_name.
    #[arg(long = "server-name", value_name = "NAME")]
    server_names: Vec<String>,
    /// A client certificate to make, named NAME (repeat for several; default: one named
    /// "client"). Written as client-NAME.pem and client-NAME.key.
    #[arg(long = "client", value_name = "NAME")]
    clients: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, default_value_t = 825)]
    days: u32,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let names = if a.server_names.is_empty() {
        vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()]
    } else {
        a.server_names.clone()
    };
    for n in &names {
        if farcache_tls::rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
            anyhow::bail!("--server-name {n:?} is not a DNS name or IP address");
        }
    }
    let clients = if a.clients.is_empty() { vec!["client".to_string()] } else { a.clients.clone() };
    for c in &clients {
        if c.is_empty() || !c.chars().all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch)) {
            anyhow::bail!("--client {c:?}: use letters, digits, '.', '_' and '-' (it names files)");
        }
    }
    // Refuse before writing anything when any file exists: no half-written deployment.
    let mut files = vec!["ca.pem".to_string(), "ca.key".into(), "server.pem".into(), "server.key".into()];
    for c in &clients {
        files.push(format!("client-{c}.pem"));
        files.push(format!("client-{c}.key"));
    }
    for f in &files {
        let p = a.out.join(f);
        if p.exists() {
            anyhow::bail!(
                "{} already exists: farcache certs never overwrites; choose an empty --out directory or remove the old files",
                p.display()
            );
        }
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;

    let days = a.days as i64;
    let ca = Ca::generate("farcache CA", days)?;
    write_new(&a.out, "ca.pem", &ca.pair.cert_pem, false)?;
    write_new(&a.out, "ca.key", &ca.pair.key_pem, true)?;
    let s = ca.server(&names, days)?;
    write_new(&a.out, "server.pem", &s.cert_pem, false)?;
    write_new(&a.out, "server.key", &s.key_pem, true)?;
    for c in &clients {
        let p = ca.client(c, days)?;
        write_new(&a.out, &format!("client-{c}.pem"), &p.cert_pem, false)?;
        write_new(&a.out, &format!("client-{c}.key"), &p.key_pem, true)?;
    }
    let d = a.out.display();
    println!(
        "wrote a CA, a server certificate for {} and {} client certificate(s) to {d} (keys mode 600)",
        names.join(", "),
        clients.len()
    );
    println!("lender:   [server] tls_cert = \"{d}/server.pem\", tls_key = \"{d}/server.key\", tls_client_ca = \"{d}/ca.pem\"");
    let c0 = &clients[0];
    println!("borrower: [cache] tls_ca = \"{d}/ca.pem\", tls_cert = \"{d}/client-{c0}.pem\", tls_key = \"{d}/client-{c0}.key\"");
    println!("keep ca.key offline: it signs new certificates");
    Ok(())
}
