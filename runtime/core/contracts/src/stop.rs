//! The emergency stop, as ISO 13850 and IEC 60204-1 describe it and as industrial controllers
//! and ROS 2 control separate it: *stopped*, *released* and *enabled* are three states, and only
//! a deliberate act moves between them.
//!
//! ```text
//!             raise (anyone, any state)
//!   Running ───────────────────────────────▶ Latched ◀── raise
//!      ▲                                        │
//!      │ resume (an operator)                   │ release (an operator)
//!      │                                        ▼
//!      └──────────────────────────────────── Paused ──── raise ──▶ Latched
//! ```
//!
//! - **Latched**: every command is the robot's hold; a move to a start pose stops within one
//!   period; no episode starts; resets are refused.
//! - **Paused**: released, but still nothing moves: the release by itself starts nothing.
//! - **Running**: an operator resumed; the next episode starts (the robot moves to its start
//!   pose under its speed limit, then the policy acts).
//!
//! A release and a resume name the e-stop they answer ([`StopSwitch::raises`] at the time the
//! operator looked): an e-stop raised after that is not released by them, so a repeated or late
//! release never clears a newer stop.
//!
//! The switch is shared (`Arc<StopSwitch>`) between the control loop, which reads it every tick
//! with two atomic loads, the robot's own slow moves (a reset), and the bus threads that raise,
//! release and resume it. Nothing here allocates on the reader's side.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Where the stop stands. On the wire (status messages) it is its name, `running`, `latched` or
/// `paused`; any other string does not decode.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum StopState {
    /// Moving is allowed.
    #[default]
    Running,
    /// An emergency stop is latched: hold, start nothing.
    Latched,
    /// Released and waiting for an operator to resume: hold, start nothing.
    Paused,
}

impl StopState {
    /// `running`, `latched` or `paused` (status messages, reports).
    pub fn as_str(self) -> &'static str {
        match self {
            StopState::Running => "running",
            StopState::Latched => "latched",
            StopState::Paused => "paused",
        }
    }

    /// The state called `s` (see [`StopState::as_str`]).
    pub fn parse(s: &str) -> Option<Self> {
        [StopState::Running, StopState::Latched, StopState::Paused]
            .into_iter()
            .find(|x| x.as_str() == s)
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => StopState::Latched,
            2 => StopState::Paused,
            _ => StopState::Running,
        }
    }
}

impl std::fmt::Display for StopState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state equals its name (`state == "latched"`), as a person or a test reads a status.
impl PartialEq<&str> for StopState {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// What a person asks of the e-stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopAct {
    /// Raise (latch) the e-stop.
    Raise,
    /// Release a latched e-stop (the robot stays still: paused).
    Release,
    /// Resume a paused run.
    Resume,
}

impl StopAct {
    /// `raise`, `release` or `resume`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopAct::Raise => "raise",
            StopAct::Release => "release",
            StopAct::Resume => "resume",
        }
    }

    /// The state the act leads to.
    pub fn leads_to(self) -> StopState {
        match self {
            StopAct::Raise => StopState::Latched,
            StopAct::Release => StopState::Paused,
            StopAct::Resume => StopState::Running,
        }
    }
}

/// Who holds an e-stop of a robot. A robot served on the bus has two: its server's (which holds
/// the robot itself, and outlives any actor) and the actor's (which holds the loop). Each
/// counts the e-stops it heard, so their counts differ when one started later, and an operator
/// names each holder's own count (`OperatorMsg::to`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopHolder {
    /// The process that serves the robot (`reflex sim serve`, `reflex hw serve`).
    Robot,
    /// The actor that drives it (`reflex run`).
    Actor,
}

impl StopHolder {
    /// `robot` or `actor`: the last part of its key (`reflex/<robot>/stop/<holder>`).
    pub fn as_str(self) -> &'static str {
        match self {
            StopHolder::Robot => "robot",
            StopHolder::Actor => "actor",
        }
    }

    /// The holder called `s` (see [`StopHolder::as_str`]).
    pub fn parse(s: &str) -> Option<Self> {
        [StopHolder::Robot, StopHolder::Actor]
            .into_iter()
            .find(|h| h.as_str() == s)
    }

    /// Whether an operator's act addressed `to` (empty: every holder) is meant for this one.
    pub fn addressed_by(self, to: &str) -> bool {
        to.is_empty() || to == self.as_str()
    }
}

/// Why a release or a resume did nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StopRefused {
    /// The act needs another state (a release needs a latched stop, a resume a paused one).
    #[error("the stop is {now}; {act} needs it {needs}")]
    State {
        /// `release` or `resume`.
        act: &'static str,
        /// The state it found.
        now: &'static str,
        /// The state it needs.
        needs: &'static str,
    },
    /// An e-stop was raised after the operator looked: it must be released on its own.
    #[error(
        "{act} answers e-stop {seen}, but {now} have been raised: look at the robot again, then release the newest"
    )]
    Newer {
        /// `release` or `resume`.
        act: &'static str,
        /// The count the operator saw.
        seen: u64,
        /// The count now.
        now: u64,
    },
}

/// Longest name kept for whoever raised, released or resumed (names come from other processes).
pub const MAX_WHO: usize = 64;

/// A name from another process made fit for a log line: printable ASCII, at most [`MAX_WHO`]
/// bytes, `?` for anything else, `unknown` when empty.
pub fn clean_name(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(MAX_WHO)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if out.trim().is_empty() {
        out = "unknown".into();
    }
    out
}

#[derive(Default)]
struct Who {
    raised_by: String,
    released_by: String,
    resumed_by: String,
}

/// The e-stop of one robot, shared by everything that may move it or stop it.
#[derive(Default)]
pub struct StopSwitch {
    state: AtomicU8,
    raises: AtomicU64,
    last_raised_unix_ns: AtomicU64,
    /// The act the last raise belonged to (0: none named).
    last_act: AtomicU64,
    who: Mutex<Who>,
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl StopSwitch {
    /// A switch in the running state.
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(StopSwitch::default())
    }

    /// The state now.
    pub fn state(&self) -> StopState {
        StopState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether anything may move the robot on its own (a policy, a reset): only when running.
    pub fn may_move(&self) -> bool {
        self.state() == StopState::Running
    }

    /// E-stops raised so far (a release and a resume name the count they answer).
    pub fn raises(&self) -> u64 {
        self.raises.load(Ordering::Acquire)
    }

    /// Wall time of the last raise, ns since the Unix epoch (0: never).
    pub fn last_raised_unix_ns(&self) -> u64 {
        self.last_raised_unix_ns.load(Ordering::Acquire)
    }

    /// Latches the stop, whatever the state; `by` names who raised it.
    pub fn raise(&self, by: &str) {
        self.raise_act(by, 0);
    }

    /// Latches the stop for the operator's act `act`, and says whether this counted as a new
    /// e-stop. A sender over the bus repeats one act until every holder confirms it, so a
    /// repeat of the act that latched the stop while it is still latched changes nothing (one
    /// press, one e-stop in the count a release must name). Any other raise counts: another
    /// act, an act of 0 (unnamed), or a repeat arriving after the stop was released, which
    /// latches it again.
    pub fn raise_act(&self, by: &str, act: u64) -> bool {
        if act != 0
            && self.state() == StopState::Latched
            && self.last_act.load(Ordering::Acquire) == act
        {
            return false;
        }
        self.last_act.store(act, Ordering::Release);
        if let Ok(mut w) = self.who.lock() {
            w.raised_by.clear();
            w.raised_by.push_str(&clean_name(by));
        }
        self.last_raised_unix_ns.store(unix_ns(), Ordering::Release);
        // The count first: a reader that sees the latch also sees this raise counted.
        self.raises.fetch_add(1, Ordering::AcqRel);
        self.state
            .store(StopState::Latched as u8, Ordering::Release);
        true
    }

    fn transition(
        &self,
        act: &'static str,
        from: StopState,
        to: StopState,
        seen: u64,
    ) -> Result<(), StopRefused> {
        let now = self.raises();
        if seen != now {
            return Err(StopRefused::Newer { act, seen, now });
        }
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|cur| StopRefused::State {
                act,
                now: StopState::from_u8(cur).as_str(),
                needs: from.as_str(),
            })?;
        // A raise between the count check and the exchange latches again after it: the raise
        // stores Latched last, so it always wins.
        if self.raises() != now {
            self.state
                .store(StopState::Latched as u8, Ordering::Release);
            return Err(StopRefused::Newer {
                act,
                seen,
                now: self.raises(),
            });
        }
        Ok(())
    }

    /// Releases the latched stop that was the `seen`-th raised: the robot stays still (paused)
    /// until someone resumes.
    pub fn release(&self, seen: u64, by: &str) -> Result<(), StopRefused> {
        self.transition("release", StopState::Latched, StopState::Paused, seen)?;
        if let Ok(mut w) = self.who.lock() {
            w.released_by = clean_name(by);
        }
        Ok(())
    }

    /// Resumes after a release (no e-stop raised since the `seen`-th): the run goes on.
    pub fn resume(&self, seen: u64, by: &str) -> Result<(), StopRefused> {
        self.transition("resume", StopState::Paused, StopState::Running, seen)?;
        if let Ok(mut w) = self.who.lock() {
            w.resumed_by = clean_name(by);
        }
        Ok(())
    }

    /// Who raised the last e-stop (empty: nobody yet).
    pub fn raised_by(&self) -> String {
        self.who
            .lock()
            .map(|w| w.raised_by.clone())
            .unwrap_or_default()
    }

    /// Who released and who resumed last (empty: nobody yet).
    pub fn released_resumed_by(&self) -> (String, String) {
        self.who
            .lock()
            .map(|w| (w.released_by.clone(), w.resumed_by.clone()))
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for StopSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopSwitch")
            .field("state", &self.state())
            .field("raises", &self.raises())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raise_latches_and_only_release_then_resume_run_again() {
        let s = StopSwitch::new();
        assert!(s.may_move());
        // Nothing to release or resume while running.
        assert!(matches!(s.release(0, "op"), Err(StopRefused::State { .. })));
        s.raise("viewer");
        assert_eq!(s.state(), StopState::Latched);
        assert_eq!(s.raised_by(), "viewer");
        // A resume does not skip the release.
        assert!(matches!(s.resume(1, "op"), Err(StopRefused::State { .. })));
        assert_eq!(s.state(), StopState::Latched);
        s.release(1, "op").unwrap();
        assert_eq!(s.state(), StopState::Paused);
        assert!(!s.may_move(), "a release by itself starts nothing");
        s.resume(1, "op").unwrap();
        assert!(s.may_move());
    }

    #[test]
    fn a_release_never_clears_an_estop_raised_after_the_operator_looked() {
        let s = StopSwitch::new();
        s.raise("a");
        let seen = s.raises();
        s.raise("b");
        let e = s.release(seen, "op").unwrap_err();
        assert!(
            matches!(
                e,
                StopRefused::Newer {
                    seen: 1,
                    now: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(s.state(), StopState::Latched);
        // Paused, then a new raise: the old count cannot resume it.
        s.release(2, "op").unwrap();
        s.raise("c");
        assert!(s.resume(2, "op").is_err());
        assert_eq!(s.state(), StopState::Latched);
        // A repeated release of the same stop does nothing more.
        s.release(3, "op").unwrap();
        assert!(s.release(3, "op").is_err());
        assert_eq!(s.state(), StopState::Paused);
    }

    #[test]
    fn repeats_of_one_act_count_once_while_it_latches_and_every_other_raise_counts() {
        let s = StopSwitch::new();
        assert!(s.raise_act("op", 7));
        // The sender repeats its act until every holder confirms: still one e-stop.
        assert!(!s.raise_act("op", 7));
        assert!(!s.raise_act("op", 7));
        assert_eq!((s.raises(), s.state()), (1, StopState::Latched));
        // Another person's press, and an unnamed raise, are e-stops of their own.
        assert!(s.raise_act("other", 8));
        assert!(s.raise_act("local", 0));
        assert!(s.raise_act("local", 0));
        assert_eq!(s.raises(), 4);
        // A late repeat after a release latches again and counts, so the operator who
        // released sees that something raised it since.
        assert!(s.raise_act("op", 9));
        s.release(5, "op").unwrap();
        assert!(s.raise_act("op", 9));
        assert_eq!((s.raises(), s.state()), (6, StopState::Latched));
    }

    #[test]
    fn names_from_other_processes_are_bounded_and_printable() {
        assert_eq!(clean_name("alice\n\u{7}"), "alice??");
        assert_eq!(clean_name(""), "unknown");
        assert_eq!(clean_name(&"x".repeat(1000)).len(), MAX_WHO);
        assert_eq!(StopState::parse("paused"), Some(StopState::Paused));
        assert_eq!(StopHolder::parse("robot"), Some(StopHolder::Robot));
    }

    #[test]
    fn an_act_addressed_to_one_holder_is_not_the_others() {
        assert!(
            StopHolder::Actor.addressed_by(""),
            "older operators address everyone"
        );
        assert!(StopHolder::Actor.addressed_by("actor"));
        assert!(!StopHolder::Actor.addressed_by("robot"));
        assert!(!StopHolder::Robot.addressed_by("actor"));
    }
}
