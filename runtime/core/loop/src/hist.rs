//! Durations recorded into an HdrHistogram (the `hdrhistogram` crate: fixed bounds, 2 significant
//! digits, so about 1% resolution): recording is an index computation and one increment with no
//! allocation, so the control loop can record every step.

use std::time::Duration;

/// Largest duration told apart, ns (one hour); longer ones are counted as one hour.
const HIGHEST_NS: u64 = 3_600_000_000_000;

/// The `p`-th percentile (0-100) of samples sorted ascending, by nearest rank: the smallest
/// sample with at least `p` % of the samples at or below it (NaN when there are none). Every
/// report that keeps its samples (benchmarks, `reflex policy bench`) uses this definition;
/// [`Histogram::percentile`] estimates the same from its buckets for what cannot keep them (the
/// control loop).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Histogram of non-negative durations in nanoseconds; the largest value is also kept exactly.
#[derive(Clone)]
pub struct Histogram {
    hdr: hdrhistogram::Histogram<u64>,
    max_ns: u64,
}

impl std::fmt::Debug for Histogram {
    // The count and extremes, not the thousands of buckets a derived Debug would print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("p50", &self.percentile(50.0))
            .field("max", &self.max())
            .finish()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram (allocates its fixed bucket array, about 37 KB, once).
    pub fn new() -> Self {
        Histogram {
            hdr: hdrhistogram::Histogram::new_with_bounds(1, HIGHEST_NS, 2)
                .expect("constant histogram bounds are valid"),
            max_ns: 0,
        }
    }

    /// Records one value.
    #[inline]
    pub fn record(&mut self, d: Duration) {
        let v = d.as_nanos().min(u64::MAX as u128) as u64;
        self.hdr.saturating_record(v);
        self.max_ns = self.max_ns.max(v);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.hdr.len()
    }

    /// Largest value recorded, exactly.
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max_ns)
    }

    /// Mean of the values recorded (from the buckets: within the histogram's resolution).
    pub fn mean(&self) -> Duration {
        if self.hdr.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.hdr.mean().round() as u64)
    }

    /// The `p`-th percentile (0-100), within about 1%, never above the exact maximum.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.hdr.is_empty() {
            return Duration::ZERO;
        }
        let v = self.hdr.value_at_quantile((p / 100.0).clamp(0.0, 1.0));
        Duration::from_nanos(v.min(self.max_ns))
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.hdr.reset();
        self.max_ns = 0;
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, o: &Histogram) {
        self.hdr
            .add(&o.hdr)
            .expect("histograms made by Histogram::new share their bounds");
        self.max_ns = self.max_ns.max(o.max_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_of_samples() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 99.0), 10.0);
        assert_eq!(percentile(&v, 90.0), 9.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn percentiles_within_resolution() {
        let mut h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.percentile(50.0).as_secs_f64() * 1e6;
        let p99 = h.percentile(99.0).as_secs_f64() * 1e6;
        assert!((p50 - 500.0).abs() / 500.0 < 0.01, "p50 {p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.01, "p99 {p99}");
        let mean = h.mean().as_secs_f64() * 1e6;
        assert!((mean - 500.5).abs() / 500.5 < 0.01, "mean {mean}");
        assert_eq!(h.max(), Duration::from_micros(1000));
        assert_eq!(h.percentile(100.0), h.max());
        assert_eq!(h.count(), 1000);
    }

    #[test]
    fn out_of_range_values_saturate_and_merge_adds_counts() {
        let mut a = Histogram::new();
        a.record(Duration::ZERO);
        a.record(Duration::from_secs(2 * 3600));
        assert_eq!(a.count(), 2);
        assert_eq!(a.max(), Duration::from_secs(2 * 3600));
        let mut b = Histogram::new();
        b.record(Duration::from_micros(5));
        b.merge(&a);
        assert_eq!(b.count(), 3);
        assert_eq!(b.max(), a.max());
        b.clear();
        assert_eq!(
            (b.count(), b.max(), b.percentile(50.0)),
            (0, Duration::ZERO, Duration::ZERO)
        );
    }
}
