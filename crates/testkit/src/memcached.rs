//! A real memcached (1.6+) for tests of memcached lenders, on a free loopback port, killed
//! and reaped on drop.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The memcached binary: on PATH, or in /usr/bin or /usr/local/bin. `make test` installs it
/// (scripts/deps.sh).
pub fn memcached_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("memcached")).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain([PathBuf::from("/usr/bin/memcached"), PathBuf::from("/usr/local/bin/memcached")])
        .find(|p| p.is_file())
        .expect("memcached is not installed: run `make deps` (Debian: apt-get install -y memcached)")
}

/// One memcached process.
pub struct MemcachedProcess {
    child: Child,
    addr: SocketAddr,
}

impl MemcachedProcess {
    /// Start memcached with `memory_mib` of item memory on 127.0.0.1 and a free port; wait
    /// (at most 10 s) until it accepts connections.
    pub fn start(memory_mib: u64) -> MemcachedProcess {
        Self::start_on(free_port(), memory_mib)
    }

    /// Start it on `port` (to restart one in place).
    pub fn start_on(port: u16, memory_mib: u64) -> MemcachedProcess {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = Command::new(memcached_bin());
        cmd.args(["-l", "127.0.0.1", "-U", "0", "-t", "2", "-c", "256"])
            .arg("-p")
            .arg(port.to_string())
            .arg("-m")
            .arg(memory_mib.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // memcached refuses to run as root unless told whom to become.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "nobody"]);
        }
        let child = cmd.spawn().expect("start memcached");
        let mut p = MemcachedProcess { child, addr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(st)) = p.child.try_wait() {
                panic!("memcached exited at start ({st}); is port {port} taken?");
            }
            assert!(Instant::now() < deadline, "memcached did not listen on {addr} within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `memcached://ip:port`, as `--server` takes it.
    pub fn url(&self) -> String {
        format!("memcached://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MemcachedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port free now (memcached cannot report one it chose).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
