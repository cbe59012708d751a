//! The load generator: one blocking connection per thread, one request outstanding per
//! connection (closed loop), TCP_NODELAY, the same logic for both systems. Only the last
//! step differs: [`Conn`] turns "GET these key ids" into farcache frames or memcached text.

use std::net::SocketAddr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use farcache_wire::Key;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::fc_client::{FcClient, PutCounts};
use crate::mc_client::McClient;
use crate::rng::{mix64, Rng};
use crate::value::{check_value, fill_value, VALUE_BYTES};
use crate::{BenchError, Result};

/// The tenant the benchmarks connect as (open mode accepts any name).
pub const TENANT: &str = "bench";
/// The farcache file id every benchmark key lives in.
const FILE_ID: u128 = 0xBE_0C;
/// Largest latency recorded exactly; slower requests are recorded as this.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// The farcache key of benchmark key `id`.
pub fn fc_key(id: u64) -> Key {
    Key::new(FILE_ID, id, 0)
}

/// A system under test, by protocol and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Farcache(SocketAddr),
    Memcached(SocketAddr),
}

impl Target {
    pub fn name(&self) -> &'static str {
        match self {
            Target::Farcache(_) => "farcache",
            Target::Memcached(_) => "memcached",
        }
    }
}

/// What came back, checked. Misses are legal (a cache may evict); mismatches never are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// GET answers with exactly the value of the key asked for.
    pub hits: u64,
    pub misses: u64,
    /// GET answers with a value that is not the key's: wrong key, torn, short.
    pub mismatches: u64,
    pub put_stored: u64,
    pub put_rejected: u64,
}

impl Tally {
    pub fn add(&mut self, o: &Tally) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.mismatches += o.mismatches;
        self.put_stored += o.put_stored;
        self.put_rejected += o.put_rejected;
    }

    fn put(&mut self, c: PutCounts) {
        self.put_stored += c.stored;
        self.put_rejected += c.rejected;
    }

    fn answer(&mut self, id: u64, v: Option<&[u8]>) {
        match v {
            None => self.misses += 1,
            Some(v) if check_value(id, v) => self.hits += 1,
            Some(_) => self.mismatches += 1,
        }
    }
}

/// One connection to a system under test: GET and PUT of batches of key ids, with every
/// answer checked into a [`Tally`]. PUTs store the value [`fill_value`] makes for the key.
pub trait Conn: Send {
    fn get(&mut self, ids: &[u64], t: &mut Tally) -> Result<()>;
    fn put(&mut self, ids: &[u64], t: &mut Tally) -> Result<()>;
}

struct FcConn {
    client: FcClient<std::net::TcpStream>,
    keys: Vec<Key>,
    values: Vec<u8>,
}

impl Conn for FcConn {
    fn get(&mut self, ids: &[u64], t: &mut Tally) -> Result<()> {
        self.keys.clear();
        self.keys.extend(ids.iter().map(|&id| fc_key(id)));
        self.client.get(&self.keys, |i, v| t.answer(ids[i], v))
    }

    fn put(&mut self, ids: &[u64], t: &mut Tally) -> Result<()> {
        self.values.resize(ids.len() * VALUE_BYTES, 0);
        for (&id, v) in ids.iter().zip(self.values.chunks_exact_mut(VALUE_BYTES)) {
            fill_value(id, v);
        }
        let entries: Vec<(Key, &[u8])> =
            ids.iter().zip(self.values.chunks_exact(VALUE_BYTES)).map(|(&id, v)| (fc_key(id), v)).collect();
        t.put(self.client.put(&entries)?);
        Ok(())
    }
}

struct McConn {
    client: McClient<std::net::TcpStream>,
    values: Vec<u8>,
}

impl Conn for McConn {
    fn get(&mut self, ids: &[u64], t: &mut Tally) -> Result<()> {
        self.client.get(ids, |i, v| t.answer(ids[i], v))
    }

    fn put(&mut self, ids: &[u64], t: &mut Tally) -> Result<()> {
        self.values.resize(ids.len() * VALUE_BYTES, 0);
        for (&id, v) in ids.iter().zip(self.values.chunks_exact_mut(VALUE_BYTES)) {
            fill_value(id, v);
        }
        let entries: Vec<(u64, &[u8])> = ids.iter().copied().zip(self.values.chunks_exact(VALUE_BYTES)).collect();
        t.put(self.client.set(&entries)?);
        Ok(())
    }
}

/// Open one connection to `target`, handshake done.
pub fn connect(target: Target) -> Result<Box<dyn Conn>> {
    Ok(match target {
        Target::Farcache(addr) => {
            let client = FcClient::connect(addr, TENANT)?;
            Box::new(FcConn { client, keys: Vec::new(), values: Vec::new() })
        }
        Target::Memcached(addr) => Box::new(McConn { client: McClient::connect(addr)?, values: Vec::new() }),
    })
}

/// Store keys `0..keys` with PUT batches of `batch`, over `connections` connections.
pub fn fill(target: Target, keys: u64, batch: usize, connections: usize) -> Result<Tally> {
    assert!(batch > 0 && connections > 0);
    let chunks = keys.div_ceil(batch as u64);
    let results: Vec<Result<Tally>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..connections as u64)
            .map(|c| {
                s.spawn(move || -> Result<Tally> {
                    let mut conn = connect(target)?;
                    let mut t = Tally::default();
                    let mut ids = Vec::with_capacity(batch);
                    for chunk in (c..chunks).step_by(connections) {
                        ids.clear();
                        ids.extend(chunk * batch as u64..((chunk + 1) * batch as u64).min(keys));
                        conn.put(&ids, &mut t)?;
                    }
                    Ok(t)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("fill thread panicked")).collect()
    });
    let mut total = Tally::default();
    for r in results {
        total.add(&r?);
    }
    Ok(total)
}

/// One measured run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpec {
    pub connections: usize,
    /// Keys per request.
    pub batch: usize,
    /// Share of requests that are GETs; the rest are PUTs of the same batch size.
    pub get_percent: u32,
    /// Keys are drawn uniformly from `0..keys`.
    pub keys: u64,
    /// Run, unmeasured, this long first (connections warm, caches of the CPU warm).
    pub warmup: Duration,
    pub duration: Duration,
    pub seed: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Keys served in the measured interval (a batch of 16 counts 16).
    pub ops: u64,
    pub requests: u64,
    pub ops_per_sec: f64,
    pub requests_per_sec: f64,
    /// Per request (a whole batch), from send to the last byte of the answer.
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_max: f64,
    /// Every answer of the run, warm-up included, checked.
    pub checked: Tally,
}

/// Drive `target` as `spec` says and measure it.
pub fn run(target: Target, spec: &RunSpec) -> Result<RunResult> {
    assert!(spec.connections > 0 && spec.batch > 0 && spec.keys > 0 && spec.get_percent <= 100);
    let barrier = Barrier::new(spec.connections);
    type Out = (Histogram<u64>, u64, Tally);
    let results: Vec<Result<Out>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.connections)
            .map(|c| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Out> {
                    let conn = connect(target);
                    // Everyone meets here even if its connect failed, so no one waits forever.
                    barrier.wait();
                    worker(conn?, spec, c as u64)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("load thread panicked")).collect()
    });
    let mut hist = new_histogram();
    let mut requests = 0;
    let mut checked = Tally::default();
    for r in results {
        let (h, n, t) = r?;
        hist.add(&h).map_err(|e| BenchError::Setup(format!("merging histograms: {e}")))?;
        requests += n;
        checked.add(&t);
    }
    let secs = spec.duration.as_secs_f64();
    let ops = requests * spec.batch as u64;
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(RunResult {
        ops,
        requests,
        ops_per_sec: ops as f64 / secs,
        requests_per_sec: requests as f64 / secs,
        latency_us_p50: us(0.50),
        latency_us_p99: us(0.99),
        latency_us_max: hist.max() as f64 / 1000.0,
        checked,
    })
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// One connection's closed loop. Requests that complete inside the measured interval are
/// counted; every answer is checked.
fn worker(mut conn: Box<dyn Conn>, spec: &RunSpec, index: u64) -> Result<(Histogram<u64>, u64, Tally)> {
    let mut rng = Rng::new(spec.seed ^ mix64(index + 1));
    let mut hist = new_histogram();
    let mut tally = Tally::default();
    let mut requests = 0u64;
    let mut ids = vec![0u64; spec.batch];
    let measure_from = Instant::now() + spec.warmup;
    let end = measure_from + spec.duration;
    loop {
        for id in ids.iter_mut() {
            *id = rng.below(spec.keys);
        }
        let is_get = rng.below(100) < spec.get_percent as u64;
        let start = Instant::now();
        if start >= end {
            break;
        }
        if is_get {
            conn.get(&ids, &mut tally)?;
        } else {
            conn.put(&ids, &mut tally)?;
        }
        let done = Instant::now();
        if start >= measure_from && done <= end {
            hist.saturating_record((done - start).as_nanos() as u64);
            requests += 1;
        }
    }
    Ok((hist, requests, tally))
}
