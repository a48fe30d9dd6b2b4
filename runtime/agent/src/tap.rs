//! What the loop's outbox feeds, off the loop's thread: the episode recorder, the bus trace for
//! `reflex viz`, the robot's ROS 2 topics and the link to the learner.

use reflex_contracts::msg::RobotSpec;
use reflex_record::{Live, Recorder, RecorderConfig, RecorderError};
use reflex_runtime::outbox::{Frames, Held, OutboxReceiver, Transition};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A recorder for `spec` writing episodes to `dir` (and to a live viewer); it draws the scene
/// the robot describes in its spec.
pub fn make_recorder(
    dir: Option<PathBuf>,
    live: Live,
    spec: &RobotSpec,
    count_gaps: bool,
) -> Result<Recorder, RecorderError> {
    Recorder::spawn(RecorderConfig {
        files: dir.is_some(),
        dir: dir.unwrap_or_default(),
        live,
        queue: 4096,
        spec: spec.clone(),
        throttle: None,
        count_gaps,
    })
}

/// What the loop's outbox feeds, off the loop's thread: the episode recorder and the bus trace
/// for `reflex viz`. One thread drains the outbox (and the camera frames) and hands each step to
/// both; neither can hold the loop up.
pub struct RecordingTap {
    /// The recorder, when recording.
    pub recorder: Option<Arc<Recorder>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<TapThreadReport>>,
    /// Directory of the episode files.
    pub dir: PathBuf,
}

/// What goes on the bus from the outbox thread: the step trace for `reflex viz`, and the robot's
/// ROS 2 topics.
#[derive(Default)]
pub struct BusOut {
    /// The trace, when `reflex viz` may watch.
    pub trace: Option<reflex_bus::trace::TracePublisher>,
    /// Joint states, TF and camera images for ROS 2, when `[ros2]` is on.
    pub ros2: Option<reflex_ros2::RobotTopics>,
    /// The loop's held ticks (the e-stop holds the robot), for ROS 2 alone.
    pub held: Option<OutboxReceiver<Held>>,
}

/// What the outbox thread reports when it ends: steps traced, frame sets dropped, step-log
/// write errors, the learner link's counters.
type TapThreadReport = (u64, u64, u64, Option<reflex_bus::learnlink::LinkStats>);

/// The outbox's consumer: hands every step to the recorder, the trace and the learner link, and
/// camera frames to the recorder and the trace.
struct Consumer {
    recorder: Option<Arc<Recorder>>,
    trace: Option<reflex_bus::trace::TracePublisher>,
    ros2: Option<reflex_ros2::RobotTopics>,
    held_ticks: Option<OutboxReceiver<Held>>,
    link: Option<reflex_bus::learnlink::ActorLink>,
    frames: Option<OutboxReceiver<Frames>>,
    held: Option<Box<Frames>>,
    steps: Option<reflex_data::steplog::StepLog>,
    step_errors: u64,
}

impl Consumer {
    /// Frames of step k are sent just before transition k; they are passed on in that order,
    /// never ahead of an earlier step's transition (a frame of the next episode must not close
    /// the current one early).
    fn frames_up_to(&mut self, upto: Option<(u64, u32)>) {
        let Some(fr) = &self.frames else { return };
        loop {
            let Some(f) = self.held.take().or_else(|| fr.try_recv()) else {
                return;
            };
            if upto.is_some_and(|k| (f.episode, f.step) > k) {
                self.held = Some(f);
                return;
            }
            if let Some(r) = &self.recorder {
                r.record_frames(&f);
            }
            if let Some(p) = &mut self.trace {
                p.offer_frames(&f);
            }
            if let Some(p) = &mut self.ros2 {
                p.offer_frames(&f);
            }
            if let Some(log) = &mut self.steps {
                log.push_frames(&f);
            }
            fr.recycle(f);
        }
    }

    /// Held ticks go to ROS 2 and nowhere else: they are no steps of any episode. Drained before
    /// each step and whenever the outbox is idle (a held loop sends no steps), so the robot's
    /// topics never go back to an older state.
    fn held_ticks(&mut self) {
        let Some(rx) = &self.held_ticks else { return };
        while let Some(h) = rx.try_recv() {
            if let Some(p) = &mut self.ros2 {
                p.offer_held(&h);
            }
            rx.recycle(h);
        }
    }

    fn step(&mut self, t: Box<Transition>, rx: &OutboxReceiver) {
        self.held_ticks();
        // The frames of an episode's last observation (sent just before its last transition)
        // go with that transition: the step log writes the episode when it ends.
        let upto = t.step + u32::from(t.ends_episode());
        self.frames_up_to(Some((t.episode, upto)));
        if let Some(r) = &self.recorder {
            r.record(&t);
        }
        if let Some(p) = &mut self.trace {
            p.offer(&t);
        }
        if let Some(p) = &mut self.ros2 {
            p.offer(&t);
        }
        if let Some(l) = &mut self.link {
            l.offer(&t);
        }
        if let Some(log) = &mut self.steps {
            let person = t.source == reflex_runtime::outbox::Source::Teleop;
            if let Err(e) = log.push(&t, person, None) {
                // A full disk: the step log stops (the recorder reports its own files).
                tracing::warn!("the step log stopped: {e}");
                self.steps = None;
                self.step_errors += 1;
            }
        }
        rx.recycle(t);
    }
}

/// What a [`RecordingTap`] did.
#[derive(Clone, Debug, Default)]
pub struct TapReport {
    /// Steps recorded.
    pub recorded: u64,
    /// Steps the recorder dropped.
    pub dropped: u64,
    /// Episode files written.
    pub episodes: u64,
    /// Steps published on the bus trace.
    pub traced: u64,
    /// Camera-frame sets dropped (the frame pool was empty, the recorder behind, or the step
    /// log could not place them on an observation).
    pub frames_dropped: u64,
    /// Errors writing recordings.
    pub write_errors: u64,
    /// Episode files cut short (kept as `.rrd.partial`).
    pub incomplete: u64,
    /// The learner link's counters, when learning.
    pub link: Option<reflex_bus::learnlink::LinkStats>,
}

impl RecordingTap {
    /// Starts a recorder for `spec` under `runs/<run_id>/episodes` and a thread that feeds it from `rx`.
    pub fn start(
        runs: &std::path::Path,
        run_id: &str,
        live: Live,
        spec: &RobotSpec,
        rx: reflex_runtime::outbox::OutboxReceiver,
    ) -> Result<Self, RecorderError> {
        let dir = runs.join(run_id).join("episodes");
        let rec = make_recorder(Some(dir.clone()), live, spec, true)?;
        Ok(Self::with(
            Some(Arc::new(rec)),
            dir,
            BusOut::default(),
            None,
            rx,
            None,
            None,
        ))
    }

    /// The general form: any of a recorder, the bus's trace and ROS 2 topics, a learner link, a
    /// frame source and a step log.
    pub fn with(
        recorder: Option<Arc<Recorder>>,
        dir: PathBuf,
        bus: BusOut,
        link: Option<reflex_bus::learnlink::ActorLink>,
        rx: OutboxReceiver,
        frames: Option<OutboxReceiver<Frames>>,
        steps: Option<reflex_data::steplog::StepLog>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = Consumer {
            recorder: recorder.clone(),
            trace: bus.trace,
            ros2: bus.ros2,
            held_ticks: bus.held,
            link,
            frames,
            held: None,
            steps,
            step_errors: 0,
        };
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("outbox".into())
            .spawn(move || {
                loop {
                    match rx.recv_timeout(Duration::from_millis(20)) {
                        Some(t) => c.step(t, &rx),
                        None if s.load(Ordering::Relaxed) => {
                            while let Some(t) = rx.try_recv() {
                                c.step(t, &rx);
                            }
                            break;
                        }
                        None => c.held_ticks(),
                    }
                    if let Some(l) = &mut c.link {
                        l.tick();
                    }
                }
                c.frames_up_to(None);
                let pool_drops = c.frames.as_ref().map_or(0, |f| f.dropped())
                    + c.steps.as_ref().map_or(0, |l| l.frames_rejected);
                let link = c.link.map(|l| l.finish());
                (
                    c.trace.map_or(0, |p| p.published),
                    pool_drops,
                    c.step_errors,
                    link,
                )
            })
            .expect("spawn the outbox thread");
        RecordingTap {
            recorder,
            stop,
            thread: Some(thread),
            dir,
        }
    }

    /// Drains what is left, finishes the files, returns the counters.
    pub fn finish(mut self) -> TapReport {
        self.stop.store(true, Ordering::Relaxed);
        let (traced, pool_drops, step_errors, link) = self
            .thread
            .take()
            .map_or((0, 0, 0, None), |t| t.join().unwrap_or((0, 0, 0, None)));
        let mut rep = TapReport {
            traced,
            frames_dropped: pool_drops,
            write_errors: step_errors,
            link,
            ..Default::default()
        };
        if let Some(rec) = self.recorder.take() {
            let st = match Arc::try_unwrap(rec) {
                Ok(r) => r.finish(),
                Err(_) => unreachable!("the outbox thread has ended"),
            };
            rep.recorded = st.recorded.load(Ordering::Relaxed);
            rep.dropped = st.dropped.load(Ordering::Relaxed);
            rep.episodes = st.episodes.load(Ordering::Relaxed);
            rep.frames_dropped += st.frames_dropped.load(Ordering::Relaxed);
            rep.write_errors += st.errors.load(Ordering::Relaxed);
            rep.incomplete = st.incomplete.load(Ordering::Relaxed);
        }
        rep
    }
}
