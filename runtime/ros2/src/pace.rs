//! How often a stream goes out: by deadline on the loop's own clock, not by the gap since the
//! last sample.
//!
//! Why (found testing against an independent ROS 2 client): with `image_hz = 10` on a 20 Hz
//! robot, images went out at 7.7 Hz. The gate was `t - last < period`: frames come every 50 ms
//! with a little jitter, so the frame 99.8 ms after the last one was skipped and the next went
//! out 150 ms after it. A [`Pace`] keeps a grid of due times instead (`next_due += period`), so
//! one frame's jitter never pushes the rest back, and it takes the sample nearest each due time,
//! whether just before or just after it. The times are the loop's (`Transition::t`,
//! `Frames::t`): simulated time in a simulation, so the rate holds in simulated time too, and
//! tests drive it with synthetic stamps.

use std::time::Duration;

/// Decides which of a stream of samples, stamped with the loop's time, go out at a rate.
///
/// Each sample nearest a due time goes; due times are `period` apart. Over any `N` samples that
/// go out, the span is `(N - 1) * period` to within the spacing of the samples offered (one
/// control period when every step's sample is offered), and it never drifts. A stream that
/// falls more than a period behind its grid (no samples for a while: a reset, a stop without
/// cameras) starts a new grid at the next sample instead of catching up in a burst; so does a
/// clock that goes back (a new run on a simulated clock).
#[derive(Clone, Debug)]
pub struct Pace {
    period: Duration,
    next_due: Option<Duration>,
    last_offered: Option<Duration>,
}

impl Pace {
    /// A stream at `hz` samples a second; `hz` must be positive and finite (the config checks
    /// it: `ros2.state_hz`, `ros2.image_hz`).
    pub fn hz(hz: f64) -> Self {
        Pace::every(Duration::from_secs_f64(1.0 / hz))
    }

    /// A stream with `period` between samples.
    pub fn every(period: Duration) -> Self {
        Pace {
            period,
            next_due: None,
            last_offered: None,
        }
    }

    /// The time between samples that go out.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Whether the sample at loop time `t` goes out (and if so, the next due time moves on).
    pub fn due(&mut self, t: Duration) -> bool {
        let prev = self.last_offered.replace(t);
        let Some(due) = self.next_due else {
            self.next_due = Some(t + self.period);
            return true;
        };
        let Some(prev) = prev.filter(|p| t >= *p) else {
            // The clock went back: the old grid means nothing now.
            self.next_due = Some(t + self.period);
            return true;
        };
        // The next sample is expected one spacing later: this one goes if it is at least as near
        // the due time as that one will be (half the spacing early at most). Capped at half a
        // period, so a slow stream never sends two samples for one due time.
        let early = ((t - prev) / 2).min(self.period / 2);
        if t + early < due {
            return false;
        }
        let next = due + self.period;
        self.next_due = Some(if t >= next { t + self.period } else { next });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    /// A reproducible jitter in `[-amp, amp]` ms (a small LCG: no dependency for a test).
    fn jitter(seed: &mut u64, amp: f64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
    }

    /// The loop times of the samples that go out, of `n` offered every `step_ms` with jitter.
    fn sent(pace: &mut Pace, n: usize, step_ms: f64, jitter_ms: f64, seed: u64) -> Vec<f64> {
        let mut s = seed;
        let mut out = Vec::new();
        for k in 0..n {
            let t = 1000.0 + k as f64 * step_ms + jitter(&mut s, jitter_ms);
            if pace.due(ms(t)) {
                out.push(t);
            }
        }
        out
    }

    /// The rate over every window of `n` samples sent: `(n - 1) / span`, and the worst span's
    /// distance from `(n - 1) * period`, ms.
    fn worst_span_error(sent: &[f64], n: usize, period_ms: f64) -> f64 {
        sent.windows(n)
            .map(|w| ((w[n - 1] - w[0]) - (n - 1) as f64 * period_ms).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn images_at_10_hz_from_a_20_hz_robot_with_jitter_go_out_at_10_hz_not_7_7() {
        // The issue: frames every 50 ms +-4 ms and `t - last < 100 ms` sent one frame in three
        // half the time, 7.7 Hz. 2,000 frames are 100 s of simulated time: 1,000 images.
        let mut pace = Pace::hz(10.0);
        let s = sent(&mut pace, 2000, 50.0, 4.0, 7);
        assert!(
            (999..=1001).contains(&s.len()),
            "{} images in 100 s of frames at 10 Hz",
            s.len()
        );
        // Any 20 consecutive images span 1.9 s to within one control period (50 ms), and no
        // gap between two is a control period off the image period.
        let e = worst_span_error(&s, 20, 100.0);
        assert!(e <= 50.0, "20 images are {e:.1} ms off 1.9 s");
        for w in s.windows(2) {
            let gap = w[1] - w[0];
            assert!((gap - 100.0).abs() <= 50.0, "images {gap:.1} ms apart");
        }
        let rate = (s.len() - 1) as f64 / ((s[s.len() - 1] - s[0]) / 1e3);
        assert!((rate - 10.0).abs() < 0.01, "{rate:.3} Hz");
    }

    #[test]
    fn the_old_gap_gate_fails_the_same_stream() {
        // The same frames through the old gate: the test above can tell the two apart.
        let (mut s, mut last, mut n) = (7u64, None::<f64>, 0);
        for k in 0..2000 {
            let t = 1000.0 + k as f64 * 50.0 + jitter(&mut s, 4.0);
            if last.is_none_or(|l| t - l >= 100.0) {
                last = Some(t);
                n += 1;
            }
        }
        assert!(n < 900, "{n} images: the old gate would have passed");
    }

    #[test]
    fn a_rate_that_does_not_divide_the_frame_rate_holds_within_one_frame_spacing() {
        // 30 Hz frames (33.3 ms) with 3 ms jitter, images at 10 Hz and at 7 Hz; frames every
        // second step (66.7 ms, a 30 Hz robot's camera at ~15 Hz) at 10 Hz.
        for (step, hz, jit) in [(33.333, 10.0, 3.0), (33.333, 7.0, 3.0), (66.667, 10.0, 3.0)] {
            let period = 1e3 / hz;
            let mut pace = Pace::hz(hz);
            let s = sent(&mut pace, 3000, step, jit, 11);
            let span_s = 3000.0 * step / 1e3;
            let want = span_s * hz;
            assert!(
                (s.len() as f64 - want).abs() <= 1.5,
                "{} samples in {span_s:.0} s at {hz} Hz from {step} ms frames, want {want:.0}",
                s.len()
            );
            // Nearest-sample choice: each within half the frame spacing (plus jitter) of its
            // due time, so any window is within one frame spacing of its ideal span.
            let e = worst_span_error(&s, 30, period);
            assert!(
                e <= step + 2.0 * jit,
                "{step} ms frames at {hz} Hz: 30 samples {e:.1} ms off"
            );
        }
    }

    #[test]
    fn a_stream_slower_than_its_rate_sends_every_sample() {
        let mut pace = Pace::hz(50.0);
        let s = sent(&mut pace, 100, 50.0, 2.0, 3);
        assert_eq!(
            s.len(),
            100,
            "a 20 Hz stream under a 50 Hz cap loses nothing"
        );
    }

    #[test]
    fn after_a_gap_the_grid_starts_again_rather_than_bursting() {
        let mut pace = Pace::hz(10.0);
        let mut got = Vec::new();
        // 1 s of frames every 10 ms, 5 s with none (a reset), then 1 s again.
        for k in (0..100).chain(600..700) {
            let t = k as f64 * 10.0;
            if pace.due(ms(t)) {
                got.push(t);
            }
        }
        let after: Vec<f64> = got.iter().copied().filter(|t| *t >= 6000.0).collect();
        assert_eq!(after.len(), 10, "{after:?}");
        assert_eq!(
            after[0], 6000.0,
            "the first frame after the gap goes at once"
        );
        for w in after.windows(2) {
            assert_eq!(w[1] - w[0], 100.0, "no burst after the gap: {after:?}");
        }
    }

    #[test]
    fn a_clock_that_goes_back_starts_a_new_grid() {
        let mut pace = Pace::hz(10.0);
        assert!(pace.due(ms(5000.0)));
        assert!(!pace.due(ms(5010.0)));
        // A new simulated run starts at 0.
        assert!(pace.due(ms(0.0)), "the first sample of the new clock");
        assert!(!pace.due(ms(10.0)));
        assert!(pace.due(ms(100.0)));
    }
}
