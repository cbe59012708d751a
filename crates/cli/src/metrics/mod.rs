//! Prometheus metrics: `--metrics-listen ADDR` (`server.metrics_listen`,
//! `mount.metrics_listen`) serves `GET /metrics` in the OpenMetrics text format.
//!
//! - `names.rs`: every metric name, kind and help text (docs/METRICS.md, "Prometheus").
//! - `http.rs`: the endpoint — a small HTTP/1.1 responder on threads of its own, bounded in
//!   connections, request size and time.
//! - `lender.rs`, `mount.rs`: a scrape renders the same snapshot `farcache stats` shows
//!   (`ServerStats`, `MountStats`) with `prometheus-client`'s encoder. Nothing is recorded
//!   for the endpoint: the counters and latency histograms are the ones the data path keeps
//!   anyway (atomics), read at scrape time, so the endpoint adds no lock or allocation there.

pub mod http;
pub mod lender;
pub mod mount;
pub mod names;

use std::fmt;

use farcache_engine::latency::LatencySnapshot;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use names::{Kind, Metric};

/// The OpenMetrics text of what `collector` encodes (ending in `# EOF`).
pub fn render(collector: impl Collector) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(collector));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// Writes metrics of the kinds [`names`] defines into an encoder.
pub struct Out<'a>(pub DescriptorEncoder<'a>);

fn metric_type(k: Kind) -> MetricType {
    match k {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
        Kind::Histogram => MetricType::Histogram,
    }
}

impl Out<'_> {
    /// A counter or gauge without labels.
    pub fn value(&mut self, m: Metric, v: u64) -> fmt::Result {
        let none: [(&str, &str); 0] = [];
        self.family(m, &[(none, v)])
    }

    /// A gauge with a fractional value, without labels.
    pub fn gauge_f64(&mut self, m: Metric, v: f64) -> fmt::Result {
        debug_assert_eq!(m.kind, Kind::Gauge);
        self.0.encode_descriptor(m.name, m.help, None, MetricType::Gauge)?.encode_gauge(&v)
    }

    /// A counter or gauge with one sample per label set (the descriptor alone if none);
    /// values whole (`u64`) or fractional (`f64`: seconds).
    pub fn family<L: EncodeLabelSet, V: EncodeCounterValue + EncodeGaugeValue>(
        &mut self,
        m: Metric,
        rows: &[(L, V)],
    ) -> fmt::Result {
        debug_assert_ne!(m.kind, Kind::Histogram);
        let mut e = self.0.encode_descriptor(m.name, m.help, None, metric_type(m.kind))?;
        for (labels, v) in rows {
            let mut s = e.encode_family(labels)?;
            match m.kind {
                Kind::Counter => s.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                _ => s.encode_gauge(v)?,
            }
        }
        Ok(())
    }

    /// A latency histogram, in seconds.
    pub fn histogram(&mut self, m: Metric, h: &LatencySnapshot) -> fmt::Result {
        debug_assert_eq!(m.kind, Kind::Histogram);
        let mut e = self.0.encode_descriptor(m.name, m.help, None, MetricType::Histogram)?;
        e.encode_histogram::<NoLabelSet>(h.sum_us as f64 / 1e6, h.count, &h.buckets_seconds(), None)
    }
}
