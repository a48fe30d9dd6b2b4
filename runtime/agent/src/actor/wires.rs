//! Wiring the loop to what runs beside it: the bus inputs and status out, the recorder's tap,
//! the learner link or an in-process learner.

use super::*;

/// Everything around the loop, started before it: the recorder, trace and learner link behind
/// the outbox, the in-process learner, and the bus's status, teleop and e-stop.
pub(super) struct Wires {
    pub(super) outbox: Option<reflex_runtime::outbox::OutboxSender>,
    pub(super) frames: Option<(
        reflex_runtime::outbox::OutboxSender<reflex_runtime::outbox::Frames>,
        u32,
    )>,
    held: Option<(
        reflex_runtime::outbox::OutboxSender<reflex_runtime::outbox::Held>,
        u32,
    )>,
    pub(super) residual: Option<(ResidualMlp, bool)>,
    teleop: Option<reflex_runtime::teleop::TeleopReader>,
    status: Option<reflex_runtime::triple::Writer<reflex_runtime::control::LoopStatus>>,
    pub(super) stop: Arc<StopSwitch>,
    pub(super) parts: Parts,
}

/// What the actor keeps alive beside the loop.
pub(super) struct Parts {
    pub(super) tap: Option<RecordingTap>,
    pub(super) learner: Option<JoinHandle<Result<LearnerReport>>>,
    pub(super) learner_stop: Arc<AtomicBool>,
    pub(super) learner_restart: Option<(zenoh::Session, LearnerConfig)>,
    pub(super) link_progress: Option<Arc<LinkProgress>>,
    pub(super) rejects: Vec<Arc<reflex_bus::Rejects>>,
    _subs: Vec<zenoh::pubsub::Subscriber<()>>,
    _stop: Option<reflex_bus::stop::StopInputs>,
    _status: Option<reflex_bus::status::StatusPublisher>,
    _spec: Option<zenoh::query::Queryable<()>>,
    _ros2: Option<reflex_ros2::Ros2Node>,
    _janitor: Option<reflex_data::rotate::Janitor>,
}

impl Wires {
    pub(super) fn start<R: Robot + 'static>(
        b: &mut ActorBuilder<R>,
        spec: &RobotSpec,
        run_id: &str,
        mode: Option<Mode>,
        features: Option<&(LoopFeatures, StepFeatureHeader)>,
    ) -> Result<Self> {
        let header = features.map(|(_, h)| h);
        let keys = Keys::new(&spec.name).map_err(reflex_bus::BusError::from)?;
        let recorder = recorder_of(b, spec, run_id)?;
        let trace = match &b.session {
            Some(s) if b.trace_hz > 0.0 => Some(reflex_bus::trace::TracePublisher::new(
                s, &keys, spec, b.trace_hz,
            )?),
            _ => None,
        };
        let ros2 = ros2_of(b, spec, &keys)?;
        let learning = match (&b.learner, &b.session, mode) {
            (Some(setup), Some(session), Some(mode)) => Some(Learning::start(
                setup, session, spec, &keys, mode, b.seed, header,
            )?),
            _ => None,
        };
        let mut w = Wires::empty(b, run_id);
        if let Some(s) = &b.session {
            w.parts._spec = Some(reflex_bus::trace::serve_spec(s, &keys, spec)?);
        }
        let mut link = None;
        if let Some(l) = learning {
            w.residual = Some(l.residual);
            w.parts.link_progress = Some(l.link.progress());
            w.parts.learner = l.thread;
            w.parts.learner_stop = l.stop;
            w.parts.learner_restart = l.restart;
            b.rejects.extend(l.link.rejects());
            link = Some(l.link);
        }
        // With a records directory, every step also goes to `<run>/steps/` in reflex's episode
        // format (who acted, base, residual), for `reflex dataset export --run`.
        let steps = match &b.record {
            Some(r) => Some(reflex_data::steplog::StepLog::create(
                &r.join(run_id).join("steps"),
                spec,
                &format!("reflex run (run {run_id})"),
            )?),
            None => None,
        };
        let (node, topics) = ros2.unzip();
        w.parts._ros2 = node;
        let bus = crate::tap::BusOut {
            trace,
            ros2: topics,
            held: None,
        };
        if recorder.is_some() || bus.trace.is_some() || bus.ros2.is_some() || link.is_some() {
            w.tap(
                spec,
                recorder,
                bus,
                link,
                steps,
                header.map_or(0, |h| h.len),
            );
        }
        if let Some(s) = &b.session {
            w.bus_inputs(
                s,
                &keys,
                spec,
                std::mem::take(&mut b.rejects),
                b.camera_figures.take(),
            )?;
        }
        Ok(w)
    }

    /// Nothing wired yet: the parts that live as long as the actor (the records' janitor).
    pub(super) fn empty<R: Robot + 'static>(b: &ActorBuilder<R>, run_id: &str) -> Self {
        Wires {
            outbox: None,
            frames: None,
            held: None,
            residual: None,
            teleop: None,
            status: None,
            stop: b.stop.clone(),
            parts: Parts {
                tap: None,
                learner: None,
                learner_stop: Arc::new(AtomicBool::new(false)),
                learner_restart: None,
                link_progress: None,
                rejects: Vec::new(),
                _subs: Vec::new(),
                _stop: None,
                _status: None,
                _spec: None,
                _ros2: None,
                _janitor: match &b.record {
                    Some(root) if !b.record_limits.is_none() => {
                        Some(reflex_data::rotate::Janitor::start(
                            root.clone(),
                            root.join(run_id),
                            b.record_limits,
                            Duration::from_secs(60),
                        ))
                    }
                    _ => None,
                },
            },
        }
    }

    /// The outbox and its consumer (recorder, trace, learner link); camera frames when someone
    /// shows them.
    fn tap(
        &mut self,
        spec: &RobotSpec,
        recorder: Option<(Arc<reflex_record::Recorder>, PathBuf)>,
        mut bus: crate::tap::BusOut,
        link: Option<ActorLink>,
        steps: Option<reflex_data::steplog::StepLog>,
        features: usize,
    ) {
        if let Some(r) = &bus.ros2 {
            // While the e-stop holds the robot the loop sends no steps; ROS 2 keeps showing it
            // from the held ticks (docs/ros2.md).
            let (htx, hrx) = reflex_runtime::outbox::held(8, spec.state_dim());
            self.held = Some((htx, r.held_every()));
            bus.held = Some(hrx);
        }
        let (otx, orx) = reflex_runtime::outbox::outbox_with_features(
            1024,
            spec.state_dim(),
            spec.action.dim(),
            features,
        );
        self.outbox = Some(otx);
        let shown = recorder.is_some() || bus.trace.is_some() || bus.ros2.is_some();
        let frx = if shown && !spec.cameras.is_empty() {
            // A few frame buffers, at up to ~15 frames per second of camera video.
            let (ftx, frx) = reflex_runtime::outbox::frames(8);
            self.frames = Some((ftx, (spec.control_hz / 15.0).round().max(1.0) as u32));
            Some(frx)
        } else {
            None
        };
        let (rec, dir) = match recorder {
            Some((r, d)) => (Some(r), d),
            None => (None, PathBuf::new()),
        };
        self.parts.tap = Some(RecordingTap::with(rec, dir, bus, link, orx, frx, steps));
    }

    /// Status out, teleop and e-stop in; `rejects` are reported in the status beside the teleop
    /// and event keys' own.
    fn bus_inputs(
        &mut self,
        s: &zenoh::Session,
        keys: &Keys,
        spec: &RobotSpec,
        mut rejects: Vec<Arc<reflex_bus::Rejects>>,
        cameras: Option<CameraFiguresFn>,
    ) -> Result<()> {
        let teleop_rejects = reflex_bus::Rejects::new(&keys.teleop);
        let event_rejects = reflex_bus::Rejects::new(&keys.events);
        let operator_rejects = reflex_bus::Rejects::new(&keys.operator);
        rejects.extend([
            teleop_rejects.clone(),
            event_rejects.clone(),
            operator_rejects.clone(),
        ]);
        self.parts.rejects = rejects.clone();
        let (w, r) = reflex_runtime::status::status_channel();
        self.status = Some(w);
        let recorder = self.parts.tap.as_ref().and_then(|t| t.recorder.as_ref());
        self.parts._status = Some(reflex_bus::status::spawn_publisher(
            s.clone(),
            keys.clone(),
            r,
            Duration::from_millis(50),
            reflex_bus::status::StatusExtras {
                recorder_dropped: recorder.map(|r| {
                    let st = r.stats_handle();
                    Box::new(move || st.dropped.load(Ordering::Relaxed))
                        as Box<dyn Fn() -> u64 + Send>
                }),
                rejects,
                stop: Some(self.stop.clone()),
                cameras,
                learner: self.parts.link_progress.clone(),
            },
        ));
        let (tw, tr) = reflex_runtime::teleop::teleop_channel(spec.action.dim());
        self.teleop = Some(tr);
        let bus_err = |key: &str, e: zenoh::Error| reflex_bus::BusError::Declare {
            key: key.into(),
            message: e.to_string(),
        };
        self.parts._subs.push(
            reflex_bus::teleop::subscribe(s, keys, tw, spec.action.dim(), teleop_rejects)
                .map_err(|e| bus_err(&keys.teleop, e))?,
        );
        self.parts._stop = Some(reflex_bus::stop::StopInputs::open(
            s,
            keys,
            reflex_contracts::stop::StopHolder::Actor,
            self.stop.clone(),
            event_rejects,
            operator_rejects,
        )?);
        Ok(())
    }

    pub(super) fn attach<R: Robot, C: Clock>(
        self,
        mut b: reflex_runtime::control::ControlLoopBuilder<R, C>,
    ) -> (reflex_runtime::control::ControlLoopBuilder<R, C>, Parts) {
        if let Some((hook, at_episode)) = self.residual {
            b = b.residual(Box::new(hook), at_episode);
        }
        if let Some(o) = self.outbox {
            b = b.outbox(o);
        }
        if let Some((f, every)) = self.frames {
            b = b.frames(f, every);
        }
        if let Some((h, every)) = self.held {
            b = b.held(h, every);
        }
        if let Some(t) = self.teleop {
            b = b.teleop(t);
        }
        if let Some(s) = self.status {
            b = b.status(s);
        }
        b = b.stop_switch(self.stop);
        (b, self.parts)
    }
}

/// The learner's side of the actor: the hook that runs the learner's actor on the loop, the
/// link that carries steps out and weights in, the in-process learner thread.
struct Learning {
    pub(super) residual: (ResidualMlp, bool),
    pub(super) link: ActorLink,
    pub(super) thread: Option<JoinHandle<Result<LearnerReport>>>,
    pub(super) stop: Arc<AtomicBool>,
    restart: Option<(zenoh::Session, LearnerConfig)>,
}

impl Learning {
    pub(super) fn start(
        setup: &LearnerSetup,
        session: &zenoh::Session,
        spec: &RobotSpec,
        keys: &Keys,
        mode: Mode,
        seed: u64,
        features: Option<&StepFeatureHeader>,
    ) -> Result<Self> {
        let sac_cfg = setup.section.learner_sac(mode, seed)?;
        if let (Some(v), Some(h)) = (&sac_cfg.vision, features)
            && v.encoder_id != h.encoder
        {
            return Err(AgentError::setup(
                format!("encoder `{}`", h.encoder),
                format!(
                    "the actor's encoder is not the one [learner.vision] names (`{}`): the learner would refuse every step",
                    v.encoder_id
                ),
            ));
        }
        let sac = Sac::new(sac_cfg, spec.state_dim(), spec.action.dim())?;
        let (hook, writer) = ResidualMlp::new(&sac, action_norm(spec, &sac), true, seed ^ 7)?;
        let (len, arch) = reflex_learn::sac::hook::actor_shape(&sac);
        let shape = reflex_bus::learnlink::WeightsShape { len, arch };
        let mut link = ActorLink::new(session, keys, setup.section.link.clone(), writer, shape)?;
        if let Some(h) = features {
            link = link.with_features(h.encoder.clone(), h.shapes.clone());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = LearnerConfig {
            robot: spec.name.clone(),
            // The actor's own robot: an in-process learner serves no fleet.
            fleet: reflex_bus::learnlink::Fleet::one(&keys.robot)
                .map_err(reflex_bus::BusError::from)?,
            section: setup.section.clone(),
            mode,
            base_model: setup.base_model.clone(),
            seed,
        };
        let thread = setup
            .section
            .in_process
            .then(|| spawn_learner(session.clone(), cfg.clone(), stop.clone()));
        Ok(Learning {
            residual: (hook, setup.section.link.swap == SwapPoint::Episode),
            link,
            thread,
            stop,
            restart: setup.section.in_process.then(|| (session.clone(), cfg)),
        })
    }
}

pub(super) fn spawn_learner(
    session: zenoh::Session,
    cfg: LearnerConfig,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<LearnerReport>> {
    std::thread::Builder::new()
        .name("learner".into())
        .spawn(move || {
            let opts = ServeOptions {
                exit_when_actor_leaves: false,
                seconds: None,
                wait_s: 60.0,
                stop: Some(stop),
            };
            crate::learner::serve(&session, &cfg, &opts, &crate::progress::Silent)
        })
        .expect("spawn the learner thread")
}

/// An observation of `spec`'s shape (zero state, black frames of every camera): what sizes the
/// loop's buffers, and a placeholder input for a policy check.
pub fn obs_template(spec: &RobotSpec) -> Observation {
    Observation {
        state: vec![0.0; spec.state_dim()],
        images: spec
            .cameras
            .iter()
            .map(|c| Image {
                camera: c.name.clone(),
                width: c.width,
                height: c.height,
                encoding: "rgb8".into(),
                seq: 0,
                age_ns: 0,
                data: vec![0; (c.width * c.height * 3) as usize],
            })
            .collect(),
        ..Default::default()
    }
}
