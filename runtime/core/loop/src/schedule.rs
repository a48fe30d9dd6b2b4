//! The fixed-rate schedule: when the next step is due and what happened to the ones that were
//! missed. Pure arithmetic on durations, so it is tested with synthetic time.

use std::time::Duration;

/// What to do after an overrun (a step that ended after the next deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Skip the missed ticks and resume on the period grid at the next deadline still ahead.
    /// The right choice for a robot: commands keep their spacing, and missed ticks are counted.
    Skip,
    /// Run the missed ticks back to back until on schedule again (simulation only: a robot
    /// would receive a burst of commands).
    Burst,
}

/// Deadline bookkeeping of a fixed-rate loop.
#[derive(Clone, Debug)]
pub struct Schedule {
    period: Duration,
    catch_up: CatchUp,
    next: Duration,
    tick: u64,
    missed: u64,
    overruns: u64,
}

/// The outcome of finishing one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Next {
    /// When the next step should start.
    pub deadline: Duration,
    /// Ticks skipped because this step ran past them.
    pub missed: u64,
    /// The step ended after the next tick's deadline.
    pub overrun: bool,
}

impl Schedule {
    /// A schedule whose first tick is due at `start`.
    pub fn new(period: Duration, catch_up: CatchUp, start: Duration) -> Self {
        assert!(!period.is_zero(), "period must be positive");
        Schedule {
            period,
            catch_up,
            next: start,
            tick: 0,
            missed: 0,
            overruns: 0,
        }
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Deadline of the step about to run.
    pub fn deadline(&self) -> Duration {
        self.next
    }

    /// Ticks run so far.
    pub fn ticks(&self) -> u64 {
        self.tick
    }

    /// Ticks skipped in total.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Steps that ended after the following deadline.
    pub fn overruns(&self) -> u64 {
        self.overruns
    }

    /// Moves the current tick's deadline to `at` (the grid restarts there) without counting
    /// anything missed: after a robot's reset, whose time is not control time.
    pub fn restart(&mut self, at: Duration) {
        self.next = at;
    }

    /// Records that the current step finished at `now` and returns when the next one is due.
    pub fn finish(&mut self, now: Duration) -> Next {
        self.tick += 1;
        let mut next = self.next + self.period;
        let overrun = now > next;
        let mut missed = 0;
        if overrun {
            self.overruns += 1;
            if self.catch_up == CatchUp::Skip {
                // Whole periods that passed entirely inside this step.
                let behind = now - next;
                let k = (behind.as_nanos() / self.period.as_nanos()) as u64 + 1;
                missed = k;
                next += self.period * k as u32;
            }
        }
        self.missed += missed;
        self.next = next;
        Next {
            deadline: next,
            missed,
            overrun,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn on_time_steps_follow_the_grid() {
        let mut s = Schedule::new(10 * MS, CatchUp::Skip, Duration::ZERO);
        for i in 1..=5u32 {
            let n = s.finish((i - 1) * 10 * MS + 2 * MS);
            assert_eq!(
                n,
                Next {
                    deadline: i * 10 * MS,
                    missed: 0,
                    overrun: false
                }
            );
        }
        assert_eq!((s.ticks(), s.missed(), s.overruns()), (5, 0, 0));
    }

    #[test]
    fn skip_drops_whole_missed_periods_and_stays_on_the_grid() {
        let mut s = Schedule::new(10 * MS, CatchUp::Skip, Duration::ZERO);
        // The step due at 0 runs until 35 ms: ticks at 10, 20 and 30 are gone.
        let n = s.finish(35 * MS);
        assert_eq!(
            n,
            Next {
                deadline: 40 * MS,
                missed: 3,
                overrun: true
            }
        );
        // Finishing exactly on the next deadline is not an overrun.
        let n = s.finish(50 * MS);
        assert_eq!(
            n,
            Next {
                deadline: 50 * MS,
                missed: 0,
                overrun: false
            }
        );
        assert_eq!((s.missed(), s.overruns()), (3, 1));
    }

    #[test]
    fn burst_runs_missed_ticks_back_to_back() {
        let mut s = Schedule::new(10 * MS, CatchUp::Burst, Duration::ZERO);
        let n = s.finish(35 * MS);
        assert_eq!(
            n,
            Next {
                deadline: 10 * MS,
                missed: 0,
                overrun: true
            }
        );
        // Deadlines at 10, 20, 30 are already past: the loop does not sleep until it is back.
        assert_eq!(s.finish(36 * MS).deadline, 20 * MS);
        assert_eq!(s.finish(37 * MS).deadline, 30 * MS);
        assert_eq!(s.finish(38 * MS).deadline, 40 * MS);
        assert_eq!(
            s.finish(41 * MS),
            Next {
                deadline: 50 * MS,
                missed: 0,
                overrun: false
            }
        );
        assert_eq!(s.missed(), 0);
    }
}
