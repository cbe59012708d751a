//! etc/k8s: the lender DaemonSet's memory limit covers its configured capacity plus the
//! overhead docs/DEPLOY.md states, its ports and paths agree with its configuration, and
//! that configuration starts the real server and serves a real client with the tenant and
//! pre-shared key the manifest sets up.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use farcache_config::ByteSize;
use farcache_testkit::{run_bin, text, ServerProcess};
use serde_yaml::Value;

const MANIFEST: &str = include_str!("../../../etc/k8s/farcache-lender.yaml");
const DEPLOY: &str = include_str!("../../../docs/DEPLOY.md");

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// A Kubernetes memory quantity in bytes ("4400Mi", "4G", "1073741824").
fn quantity(q: &str) -> u64 {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap_or_else(|_| panic!("bad quantity {q:?}")) * mult;
        }
    }
    q.parse().unwrap_or_else(|_| panic!("bad quantity {q:?}"))
}

/// The lender's memory beyond its capacity, as docs/DEPLOY.md ("Sizing") states it.
fn overhead(capacity: u64, max_buffer: u64, max_connections: u64) -> u64 {
    capacity / 50 + max_buffer + max_connections * (32 << 10) + (16 << 20)
}

fn documents() -> Vec<Value> {
    serde_yaml::Deserializer::from_str(MANIFEST).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in etc/k8s/farcache-lender.yaml"))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

#[test]
fn the_lender_daemonset_fits_its_capacity_and_its_configuration_serves() {
    let docs = documents();
    let toml_text = s(&of_kind(&docs, "ConfigMap")["data"]["farcache.toml"]).to_string();
    let cfg: toml::Value = toml::from_str(&toml_text).unwrap();
    let server = &cfg["server"];
    let size = |k: &str, default: &str| {
        ByteSize::from_str(server.get(k).and_then(|v| v.as_str()).unwrap_or(default)).unwrap().bytes()
    };
    let capacity = size("capacity", "512MiB");
    let max_buffer = size("max_buffer_bytes", "64MiB");
    let max_connections = server.get("max_connections").and_then(|v| v.as_integer()).unwrap_or(1024) as u64;

    let ds = of_kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"];
    let c = &pod["spec"]["containers"][0];
    let (req, lim) = (&c["resources"]["requests"]["memory"], &c["resources"]["limits"]["memory"]);
    assert_eq!(req, lim, "memory requests and limits must be equal (Guaranteed QoS)");
    let limit = quantity(s(lim));
    let need = capacity + overhead(capacity, max_buffer, max_connections);
    assert!(limit >= need, "memory limit {} < capacity {capacity} + overhead = {need} bytes", s(lim));
    assert!(limit <= need + need / 20, "memory limit {} wastes more than 5% over the {need} bytes needed", s(lim));
    assert!(
        DEPLOY.contains("2% of capacity") && DEPLOY.contains("max_connections × 32 KiB"),
        "DEPLOY.md states the overhead"
    );

    // The configuration file the container reads is the ConfigMap's.
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(s).collect();
    let path = args[args.iter().position(|a| *a == "--config").expect("--config") + 1];
    let mounts = c["volumeMounts"].as_sequence().unwrap();
    let m = mounts.iter().find(|m| m["mountPath"] == path).unwrap_or_else(|| panic!("nothing mounted at {path}"));
    let vol = pod["spec"]["volumes"].as_sequence().unwrap().iter().find(|v| v["name"] == m["name"]).unwrap();
    assert_eq!(vol["configMap"]["name"], of_kind(&docs, "ConfigMap")["metadata"]["name"]);
    assert_eq!(s(&m["subPath"]), "farcache.toml");
    // Ports: what it listens on is what the pod declares and Prometheus scrapes.
    let port = |k: &str| server[k].as_str().unwrap().rsplit(':').next().unwrap().parse::<u64>().unwrap();
    let ports: Vec<u64> =
        c["ports"].as_sequence().unwrap().iter().map(|p| p["containerPort"].as_u64().unwrap()).collect();
    assert_eq!(ports, [port("listen"), port("metrics_listen")]);
    assert_eq!(s(&pod["metadata"]["annotations"]["prometheus.io/port"]), port("metrics_listen").to_string());
    // Every file the configuration names lives on the secret volume.
    let secrets_at = s(&mounts.iter().find(|m| m["name"] == "secrets").unwrap()["mountPath"]).to_string();
    let file_settings: Vec<&str> =
        toml_text.lines().filter(|l| l.split('=').next().is_some_and(|k| k.trim().ends_with("_file"))).collect();
    assert!(file_settings.len() >= 2, "the tenant secret and the PSK: {file_settings:?}");
    for line in file_settings {
        assert!(line.contains(&format!("\"{secrets_at}/")), "{line}: not on the secret volume {secrets_at}");
    }

    // The real server starts with it (the files made as the manifest's comment says), and a
    // client with the tenant's secret and the pre-shared key is served.
    let dir = tempfile::tempdir().unwrap();
    let psk = dir.path().join("tls.psk");
    let out = run_bin(bin(), &["keygen", "--out", psk.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let secret = dir.path().join("db1.secret");
    fs::write(&secret, "c2VjcmV0LW9mLWRiMS1mb3ItdGhlLXRlc3Q=\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o400)).unwrap();
    let local = toml_text
        .replace(&secrets_at, dir.path().to_str().unwrap())
        .replace("\"0.0.0.0:7411\"", "\"127.0.0.1:0\"")
        .replace("\"0.0.0.0:7412\"", "\"127.0.0.1:0\"");
    let srv = ServerProcess::start(bin(), &[], Some(&local));
    assert!(srv.wait_for_stderr(Duration::from_secs(10), |l| l.contains("metrics on http://")).is_some());
    let addr = srv.addr().to_string();
    let out = run_bin(
        bin(),
        &[
            "check",
            "--server",
            &addr,
            "--size",
            "4MiB",
            "--tenant",
            "db1",
            "--secret-file",
            secret.to_str().unwrap(),
            "--tls-psk-file",
            psk.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "farcache check with the manifest's tenant: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
