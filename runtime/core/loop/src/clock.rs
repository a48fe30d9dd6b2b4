//! Time for the control loop.
//!
//! The loop never reads the system clock directly: it asks a [`Clock`]. On hardware and in
//! real-time simulation that is [`WallClock`]; in lockstep training it is [`SimClock`], whose time
//! only moves when the loop sleeps, so a run takes as little wall time as the CPU allows and is
//! reproducible from its seed. Scheduler logic is tested with synthetic time, never by sleeping.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of monotonic time measured from the clock's own start.
pub trait Clock: Send {
    /// Time since the clock started.
    fn now(&self) -> Duration;
    /// Blocks (or, for simulated time, advances) until `deadline`; returns the time after waking.
    fn sleep_until(&mut self, deadline: Duration) -> Duration;
    /// `true` for wall time; `false` when time only moves with the loop.
    fn is_wall(&self) -> bool;
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
    fn sleep_until(&mut self, deadline: Duration) -> Duration {
        (**self).sleep_until(deadline)
    }
    fn is_wall(&self) -> bool {
        (**self).is_wall()
    }
}

/// Wall time with a precise wake-up: the thread sleeps until `spin` before the deadline, then
/// spins. The timer slack of the thread is set to 1 ns so the kernel does not batch its wake-up
/// (Linux's default slack is 50 us).
pub struct WallClock {
    start: Instant,
    spin: Duration,
}

impl WallClock {
    /// A wall clock starting now, spinning for the last `spin` before each deadline.
    pub fn new(spin: Duration) -> Self {
        set_timer_slack_ns(1);
        WallClock {
            start: Instant::now(),
            spin,
        }
    }

    /// The instant this clock counts from.
    pub fn start(&self) -> Instant {
        self.start
    }
}

#[cfg(target_os = "linux")]
fn set_timer_slack_ns(ns: u64) {
    // Best effort: the default slack (50 us) only makes wake-ups later, which the spin absorbs.
    if let Err(e) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(ns)) {
        tracing::debug!("timer slack {ns} ns refused: {e}");
    }
}

#[cfg(not(target_os = "linux"))]
fn set_timer_slack_ns(_ns: u64) {}

impl Clock for WallClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn sleep_until(&mut self, deadline: Duration) -> Duration {
        let target = self.start + deadline;
        let now = Instant::now();
        if target > now + self.spin {
            std::thread::sleep(target - self.spin - now);
        }
        while Instant::now() < target {
            std::hint::spin_loop();
        }
        self.now()
    }

    fn is_wall(&self) -> bool {
        true
    }
}

/// Simulated time, shared by handle: the loop's sleeps advance it, optionally by a seeded random
/// wake-up lateness, so that timing-dependent logic can be exercised reproducibly.
#[derive(Clone)]
pub struct SimClock {
    now_ns: Arc<AtomicU64>,
    jitter: Option<(ChaCha8Rng, Duration)>,
}

impl SimClock {
    /// A simulated clock at t = 0 with exact wake-ups.
    pub fn new() -> Self {
        SimClock {
            now_ns: Arc::new(AtomicU64::new(0)),
            jitter: None,
        }
    }

    /// A simulated clock whose wake-ups are late by a uniform random amount in `[0, max)` drawn
    /// from `seed`.
    pub fn with_jitter(seed: u64, max: Duration) -> Self {
        SimClock {
            now_ns: Arc::new(AtomicU64::new(0)),
            jitter: Some((ChaCha8Rng::seed_from_u64(seed), max)),
        }
    }

    /// Moves time forward by `d` (a test's way to let time pass, e.g. a slow step).
    pub fn advance(&self, d: Duration) {
        self.now_ns.fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the time.
    pub fn set(&self, t: Duration) {
        self.now_ns.store(t.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Default for SimClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns.load(Ordering::SeqCst))
    }

    fn sleep_until(&mut self, deadline: Duration) -> Duration {
        let late = match &mut self.jitter {
            Some((rng, max)) if !max.is_zero() => {
                Duration::from_nanos(rng.random_range(0..max.as_nanos() as u64))
            }
            _ => Duration::ZERO,
        };
        let now = self.now();
        let wake = deadline.max(now) + late;
        self.set(wake);
        wake
    }

    fn is_wall(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_clock_moves_only_when_sleeping_or_advanced() {
        let mut c = SimClock::new();
        assert_eq!(c.now(), Duration::ZERO);
        assert_eq!(
            c.sleep_until(Duration::from_millis(10)),
            Duration::from_millis(10)
        );
        c.advance(Duration::from_millis(3));
        assert_eq!(c.now(), Duration::from_millis(13));
        // A deadline in the past does not move time backwards.
        assert_eq!(
            c.sleep_until(Duration::from_millis(5)),
            Duration::from_millis(13)
        );
    }

    #[test]
    fn jittered_sim_clock_is_reproducible_from_its_seed() {
        let run = |seed| {
            let mut c = SimClock::with_jitter(seed, Duration::from_micros(50));
            (1..100)
                .map(|i| c.sleep_until(Duration::from_millis(i)))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let r = run(7);
        assert!(
            r.iter()
                .enumerate()
                .all(|(i, t)| *t >= Duration::from_millis(i as u64 + 1))
        );
    }
}
