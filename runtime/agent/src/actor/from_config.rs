//! An actor from a run config: the policy, the kept residual, the robot (simulated, remote or
//! an arm) with its reward and cameras, the recorder and the ROS 2 node, then the episodes.

use super::*;

/// How `reflex run` runs a config, besides the file.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Endpoints and Zenoh settings added to the file's `[bus]`.
    pub bus: BusConfig,
    /// Episodes (default `[run] episodes`).
    pub episodes: Option<u64>,
    /// Record episodes under this directory.
    pub record: Option<PathBuf>,
    /// Live viewer.
    pub live: Live,
    /// Trace rate for `reflex viz`, Hz (default `[bus] trace_hz`).
    pub trace_hz: Option<f64>,
    /// Print a line per episode through the progress sink (what `reflex run` shows).
    pub episode_lines: bool,
    /// Ends the run from outside (SIGTERM from systemd, Ctrl-C: [`crate::signals`]): finish
    /// after the episode in progress (it is recorded and its steps reach the learner), or stop
    /// at the next tick.
    pub stop: Option<StopHandle>,
}

/// How ONNX Runtime runs the config's models (the base policy, and a frozen image encoder
/// beside it).
fn onnx_options(cfg: &RunConfig) -> reflex_policies::onnx_policy::RunOptions {
    reflex_policies::onnx_policy::RunOptions {
        provider: cfg.policy.provider.clone(),
        intra_threads: cfg.policy.intra_threads,
        seed: cfg.policy.seed,
        execute: cfg.policy.execute,
    }
}

/// Builds the policy a config names, for a robot with `spec`.
pub fn make_policy(cfg: &RunConfig, spec: &RobotSpec) -> Result<Option<Box<dyn Policy>>> {
    Ok(match cfg.policy.kind {
        PolicyKind::None => None,
        PolicyKind::Onnx => {
            let model =
                cfg.policy.model.clone().ok_or_else(|| {
                    AgentError::setup("[policy]", "kind = \"onnx\" needs `model`")
                })?;
            let mut p =
                reflex_policies::onnx_policy::OnnxPolicy::load(&model, spec, &onnx_options(cfg))?;
            if cfg.policy.rtc.enabled {
                if p.spec().kind == reflex_policies::spec::PolicyKind::Chunk {
                    return Err(AgentError::setup(
                        "[policy.rtc]",
                        format!(
                            "`{}` is a chunk policy (one call, no sampler), so there is nothing to inpaint: set `enabled = false`, or use a diffusion or flow model",
                            model.display()
                        ),
                    ));
                }
                if let Some(why) = p.rtc_unsupported() {
                    return Err(AgentError::setup(
                        "[policy.rtc]",
                        format!("`{}`: {why}: set `enabled = false`", model.display()),
                    ));
                }
                let guided = p.spec().kind == reflex_policies::spec::PolicyKind::Flow
                    && p.has_vjp()
                    && cfg.policy.rtc.guidance;
                tracing::info!(
                    "real-time chunking on `{}`: {}",
                    model.display(),
                    if guided {
                        "guided by the velocity's VJP graph (the paper's method)"
                    } else if p.spec().kind == reflex_policies::spec::PolicyKind::Flow {
                        "hard inpainting (no VJP graph beside the model, or guidance = false)"
                    } else {
                        "hard inpainting (a diffusion policy's DDIM)"
                    }
                );
                p.set_rtc(cfg.policy.rtc.clone());
            }
            Some(Box::new(p))
        }
        #[cfg(not(feature = "sim"))]
        PolicyKind::Expert => return Err(without_sim("[policy] kind = \"expert\"")),
        #[cfg(feature = "sim")]
        PolicyKind::Expert => Some(Box::new(
            reflex_sim::expert::ExpertPolicy::new(
                spec,
                cfg.policy.noise,
                cfg.policy.seed,
                cfg.policy.chunk_len,
            )
            .map_err(|e| {
                AgentError::setup(
                    "[policy] kind = \"expert\"",
                    format!("{e} (the expert drives the simulator's tasks only)"),
                )
            })?,
        )),
    })
}

/// The kept residual of `[policy.residual]`, checked against the robot, the base policy and
/// (with ONNX Runtime) its own graph; `None` without one.
pub fn load_residual(cfg: &RunConfig, spec: &RobotSpec) -> Result<Option<KeptResidual>> {
    use reflex_learn::sac::export::{ResidualMode, ResidualModel};
    let Some(r) = &cfg.policy.residual else {
        return Ok(None);
    };
    let m = ResidualModel::load(&r.model)?;
    let file = r.model.display().to_string();
    let unfit =
        |message: String| AgentError::setup(format!("[policy.residual] model `{file}`"), message);
    match (m.spec.mode, cfg.policy.kind) {
        (ResidualMode::Residual, PolicyKind::Onnx) => {
            let base = cfg
                .policy
                .model
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|f| f.to_string_lossy().into_owned());
            if let Some(want) = &m.spec.base_model
                && base.as_deref() != Some(want.as_str())
            {
                return Err(unfit(format!(
                    "was trained on the base `{want}`, but [policy] model is `{}`: a residual corrects one base policy; run it on that one",
                    base.unwrap_or_default()
                )));
            }
        }
        (ResidualMode::Full, PolicyKind::None) => {}
        (mode, kind) => {
            return Err(unfit(format!(
                "is a {mode:?} file and [policy] kind is {kind:?}: a residual runs on kind = \"onnx\" (its base), a full-mode file on kind = \"none\""
            )));
        }
    }
    if m.spec.state_dim != spec.state_dim() || m.spec.action_dim != spec.action.dim() {
        return Err(unfit(format!(
            "takes {} state values and {} actions; robot `{}` has {} and {}",
            m.spec.state_dim,
            m.spec.action_dim,
            spec.name,
            spec.state_dim(),
            spec.action.dim()
        )));
    }
    let same = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-6 * x.abs().max(1.0))
    };
    if !same(&m.spec.action_low, &spec.action.low) || !same(&m.spec.action_high, &spec.action.high)
    {
        return Err(unfit(format!(
            "was made for action bounds {:?}..{:?}; robot `{}` has {:?}..{:?}",
            m.spec.action_low, m.spec.action_high, spec.name, spec.action.low, spec.action.high
        )));
    }
    let gap = m.check_with_ort(32, 0)?;
    if gap > 1e-4 {
        return Err(unfit(format!(
            "its graph and its weights disagree by {gap:.2e} (ONNX Runtime against reflex's evaluation): the file was changed after export; export it again"
        )));
    }
    tracing::info!(
        "kept residual `{file}` ({:?} mode, hidden {:?}); ONNX Runtime agrees within {gap:.1e}",
        m.spec.mode,
        m.spec.hidden
    );
    let encoder = match &m.spec.vision {
        None => None,
        Some(v) => Some(residual_encoder(r, v, &cfg.policy.model, &file)?),
    };
    Ok(Some(KeptResidual {
        hook: m.hook(),
        encoder,
    }))
}

/// A kept residual ready for the loop, with the encoder file its image heads read.
pub struct KeptResidual {
    /// The hook.
    pub hook: ResidualMlp,
    /// The frozen encoder (a residual that sees), checked to be the one it was trained with.
    pub encoder: Option<PathBuf>,
}

/// The encoder a residual with image heads was trained with: `[policy.residual] encoder`, else
/// the file of that name beside the residual or the base model; its bytes must be the same.
fn residual_encoder(
    r: &crate::config::ResidualSection,
    v: &reflex_learn::sac::VisionHeads,
    base: &Option<PathBuf>,
    file: &str,
) -> Result<PathBuf> {
    let name = v.encoder_id.split('#').next().unwrap_or_default();
    let candidates: Vec<PathBuf> = match &r.encoder {
        Some(p) => vec![p.clone()],
        None => [Some(r.model.as_path()), base.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(|p| p.parent())
            .map(|d| d.join(name))
            .collect(),
    };
    for c in &candidates {
        if let Ok(bytes) = std::fs::read(c) {
            let id = reflex_policies::features::encoder_id(c, &bytes);
            if id == v.encoder_id {
                return Ok(c.clone());
            }
            if r.encoder.is_some() {
                return Err(AgentError::setup(
                    "[policy.residual] encoder",
                    format!(
                        "`{}` is `{id}`, but residual `{file}` was trained on maps of `{}`: name that file",
                        c.display(),
                        v.encoder_id
                    ),
                ));
            }
        }
    }
    Err(AgentError::setup(
        format!("[policy.residual] model `{file}`"),
        format!(
            "it sees through the frozen encoder `{}`, found in none of {:?}: set [policy.residual] encoder to that file",
            v.encoder_id, candidates
        ),
    ))
}

/// Repeats a warning every `every` (the first at once) until dropped.
pub struct Nag {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl Nag {
    /// Starts warning `message`.
    pub fn start(message: String, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("warn".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    tracing::warn!("{message}");
                    let t0 = Instant::now();
                    while t0.elapsed() < every && !s.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
            .expect("spawn the warning thread");
        Nag {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Nag {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Refuses a real arm on a bus without TLS unless `[bus] insecure = true`; with it, a warning
/// now and every minute while the returned guard lives.
pub fn check_arm_bus(cfg: &RunConfig, bus: &BusConfig) -> Result<Option<Nag>> {
    match cfg.insecure_arm_bus(bus) {
        None => Ok(None),
        Some(why) if !cfg.bus.insecure => Err(AgentError::setup("[bus]", why)),
        Some(_) => Ok(Some(Nag::start(
            format!(
                "INSECURE: robot `{}` is a real arm on a bus without TLS ([bus] insecure = true): anyone on the network can take it over, reset it or release its e-stop",
                cfg.robot_name()
            ),
            Duration::from_secs(60),
        ))),
    }
}

/// `robot` with its cameras renamed by `[robot.cameras]` (checked against it here), judged by
/// the success classifier of `[reward]`, if the config has one: inline in simulated time, on its
/// own thread in real time; unchanged otherwise.
pub fn with_reward<R: Robot>(
    robot: R,
    cfg: &RunConfig,
) -> Result<reflex_adapters::reward::ClassifiedReward<reflex_adapters::cameras::CamerasRenamed<R>>>
{
    // The cameras under the names the classifier, the policy and the encoder read.
    let robot = reflex_adapters::cameras::CamerasRenamed::new(robot, &cfg.robot.cameras)
        .map_err(|e| crate::AgentError::setup("[robot.cameras]", e.0))?;
    let Some(r) = &cfg.reward else {
        return Ok(reflex_adapters::reward::ClassifiedReward::passthrough(
            robot,
        ));
    };
    judged_by(
        robot,
        &r.classifier,
        r.threshold,
        r.consecutive_frames,
        cfg.run.clock == ClockKind::Sim,
        r.max_age_frames,
        &onnx_options(cfg),
    )
}

/// `robot` judged by the success classifier in file `classifier`: success at `threshold` (default
/// the classifier's own, from its spec) for `consecutive_frames` frames in a row, judged inline
/// or on the classifier's own thread (verdicts more than `max_age` frames old unused). A
/// classifier reading a camera the robot lacks is refused.
pub fn judged_by<R: Robot>(
    robot: R,
    classifier: &std::path::Path,
    threshold: Option<f32>,
    consecutive_frames: u32,
    inline: bool,
    max_age: u32,
    opts: &reflex_policies::onnx_policy::RunOptions,
) -> Result<reflex_adapters::reward::ClassifiedReward<R>> {
    use reflex_adapters::reward::{ClassifiedReward, RewardRule};
    let c = reflex_policies::reward::SuccessClassifier::load(classifier, opts)?;
    let spec = robot.spec();
    for cam in c.cameras() {
        if !spec.cameras.iter().any(|k| k.name == cam) {
            return Err(AgentError::setup(
                format!("[reward] classifier `{}`", classifier.display()),
                format!(
                    "it reads camera `{cam}`, which robot `{}` does not have (cameras: {:?}; a simulator's need [sim.cameras] enabled = true; one under another name is mapped in [robot.cameras])",
                    spec.name,
                    spec.cameras.iter().map(|k| &k.name).collect::<Vec<_>>()
                ),
            ));
        }
    }
    let rule = RewardRule {
        threshold: threshold.unwrap_or(c.spec().threshold),
        consecutive_frames,
    };
    tracing::info!(
        "reward: classifier `{}`, success at p >= {} for {} frame(s) in a row",
        classifier.display(),
        rule.threshold,
        rule.consecutive_frames
    );
    let driver = FeatureDriver::start(Box::new(c), inline, &obs_template(spec).images, max_age)
        .map_err(|e| AgentError::setup("the reward classifier's thread", e.to_string()))?;
    Ok(ClassifiedReward::new(robot, driver, rule))
}

/// The simulator of `[sim]`, named by `[robot] name`.
#[cfg(feature = "sim")]
fn sim_robot(cfg: &RunConfig) -> Result<reflex_sim::SimEnv> {
    let mut sim = cfg
        .sim
        .clone()
        .ok_or_else(|| AgentError::setup("[robot] source = \"sim\"", "needs a [sim] table"))?;
    if let Some(n) = &cfg.robot.name {
        sim.robot = n.clone();
    }
    Ok(reflex_sim::SimEnv::new(sim)?)
}

/// Runs a run config to the end: what `reflex run --config F` does.
pub fn run_config(cfg: &RunConfig, o: &RunOptions, progress: &dyn Progress) -> Result<RunReport> {
    let _insecure = check_arm_bus(cfg, &o.bus)?;
    let use_bus = cfg.uses_bus(&o.bus);
    let session = if use_bus {
        Some(cfg.bus_config(&o.bus).open()?)
    } else {
        None
    };
    let episodes = o.episodes.unwrap_or(cfg.run.episodes);
    match cfg.robot.source {
        #[cfg(not(feature = "sim"))]
        RobotSource::Sim => Err(without_sim("[robot] source = \"sim\"")),
        #[cfg(feature = "sim")]
        RobotSource::Sim => drive(
            ActorBuilder::new(with_reward(sim_robot(cfg)?, cfg)?),
            Some(reflex_tabletop::ArmModel::so101().chain),
            cfg,
            session,
            o,
            episodes,
            progress,
        ),
        RobotSource::Remote => {
            let name = cfg.robot_name();
            let s = session.as_ref().expect("remote robots use the bus");
            let mut robot = RemoteRobot::connect(
                s,
                &name,
                Duration::from_secs_f64(cfg.robot.timeout_ms / 1e3),
            )?;
            if let Some(ms) = cfg.robot.resend_ms {
                robot.set_resend_after(Duration::from_secs_f64(ms / 1e3));
            }
            if cfg.run.clock == ClockKind::Sim && !robot.spec().lockstep {
                return Err(AgentError::setup(
                    "[run] clock = \"sim\"",
                    format!(
                        "simulated time needs a lockstep robot; `{name}` runs on its own clock: use clock = \"wall\""
                    ),
                ));
            }
            let (rejects, dropped, resent) = (robot.rejects(), robot.dropped(), robot.resent());
            let b = ActorBuilder::new(with_reward(robot, cfg)?)
                .count_rejects(rejects)
                .count_rejects(dropped)
                .count_rejects(resent);
            drive(b, None, cfg, session, o, episodes, progress)
        }
        RobotSource::So101 | RobotSource::Koch => {
            let arm_cfg = cfg.arm.as_ref().ok_or_else(|| {
                AgentError::setup("[robot] source", "a real arm needs an [arm] table")
            })?;
            if cfg.run.clock == ClockKind::Sim {
                return Err(AgentError::setup(
                    "[run] clock = \"sim\"",
                    "a real arm runs on its own clock: use clock = \"wall\"",
                ));
            }
            let kind = match cfg.robot.source {
                RobotSource::So101 => reflex_hardware::arm::ArmKind::So101Follower,
                _ => reflex_hardware::arm::ArmKind::KochFollower,
            };
            let mut robot =
                reflex_hardware::robot::ArmRobot::open(kind, &cfg.robot_name(), arm_cfg)?;
            robot.set_on_exit(cfg.robot.on_exit);
            let handle = robot.report_handle();
            let monitors = robot.camera_monitors();
            let chain = (kind == reflex_hardware::arm::ArmKind::So101Follower)
                .then(|| reflex_tabletop::ArmModel::so101().chain);
            let mut builder = ActorBuilder::new(with_reward(robot, cfg)?);
            if !monitors.is_empty() {
                builder = builder.camera_figures(Box::new(move || {
                    monitors
                        .iter()
                        .map(|m| {
                            let s = m.stats();
                            reflex_contracts::msg::CameraFigures {
                                name: s.name,
                                frames: s.frames,
                                fps: s.fps,
                                used: s.used,
                                skipped: s.skipped,
                                errors: s.errors,
                                age_at_use_ms: s.age_at_use_ms,
                            }
                        })
                        .collect()
                }));
            }
            let mut report = drive(builder, chain, cfg, session, o, episodes, progress)?;
            report.arm = handle.lock().ok().and_then(|g| g.clone());
            Ok(report)
        }
    }
}

fn drive<R: Robot + 'static>(
    b: ActorBuilder<reflex_adapters::reward::ClassifiedReward<R>>,
    default_chain: Option<Chain>,
    cfg: &RunConfig,
    session: Option<zenoh::Session>,
    o: &RunOptions,
    episodes: u64,
    progress: &dyn Progress,
) -> Result<RunReport> {
    let policy = make_policy(cfg, b.robot.spec())?;
    let chain = match &cfg.robot.urdf {
        Some(p) => Some(Chain::from_urdf_file(p, "base", "tcp")?),
        None => default_chain,
    };
    let clock = match cfg.run.clock {
        ClockKind::Sim => ClockChoice::Sim,
        ClockKind::Wall => ClockChoice::Wall {
            spin: Duration::from_secs_f64(cfg.loop_.as_ref().map_or(50.0, |l| l.spin_us) / 1e6),
        },
    };
    let mut b = b
        .clock(clock)
        .safety(cfg.safety.clone())
        .chain(chain)
        .seed(cfg.run.seed)
        .live(o.live.clone())
        .trace_hz(o.trace_hz.unwrap_or(cfg.bus.trace_hz));
    if let Some(r) = cfg.ros2.as_ref().filter(|r| r.enabled) {
        let c = r
            .config(b.robot.spec().name.as_str())
            .map_err(|e| AgentError::setup("[ros2]", e))?;
        b = b.ros2(c);
    }
    if let Some(p) = policy {
        b = b.policy(p);
    }
    let opts = onnx_options(cfg);
    if let Some(k) = load_residual(cfg, b.robot.spec())? {
        b = b.residual_model(k.hook);
        if let Some(e) = k.encoder {
            b = b.encoder(FeatureEncoder::load(&e, &opts)?, DEFAULT_MAP_AGE);
        }
    }
    if let Some(v) = cfg.learner.as_ref().and_then(|l| l.vision.as_ref()) {
        // The encoder runs where the base policy runs, with its execution provider.
        b = b.encoder(
            FeatureEncoder::load(&v.encoder, &opts)?,
            v.max_map_age_frames,
        );
    }
    if let Some(l) = cfg.loop_.clone() {
        b = b.loop_config(l);
    }
    if let Some(s) = session {
        b = b.bus(s);
    }
    if let Some(r) = &o.record {
        b = b.record(r.clone()).record_limits(cfg.run.record_limits());
    }
    if let Some(l) = &cfg.learner {
        b = b.learner(LearnerSetup {
            section: l.clone(),
            base_model: cfg.policy.model.clone(),
        });
        if cfg.run.clock == ClockKind::Sim && !l.pace_lockstep {
            tracing::info!("the learner is not paced: the actor may run ahead of it");
        }
    }
    let mut actor = b.build()?;
    if cfg.learner.as_ref().is_some_and(|l| !l.pace_lockstep) {
        actor.pace = false;
    }
    actor.episode_lines = o.episode_lines;
    if let Some(h) = &o.stop {
        actor.set_stop_handle(h.clone());
    }
    actor.run_episodes(episodes, progress)?;
    if cfg.run.eval_episodes > 0 {
        actor.evaluate(cfg.run.eval_episodes, progress)?;
    }
    let reward = actor.control_loop().robot().counts();
    let mut report = actor.finish()?;
    report.reward = reward;
    Ok(report)
}

/// The recorder of a run that records or shows itself live, and where its files go.
pub(super) fn recorder_of<R: Robot + 'static>(
    b: &ActorBuilder<R>,
    spec: &RobotSpec,
    run_id: &str,
) -> Result<Option<(Arc<reflex_record::Recorder>, PathBuf)>> {
    Ok(if b.record.is_some() || b.live != Live::Off {
        // Files only with a records directory; a live view alone writes nothing.
        let dir = b.record.as_ref().map(|r| r.join(run_id).join("episodes"));
        Some((
            Arc::new(make_recorder(dir.clone(), b.live.clone(), spec, true)?),
            dir.unwrap_or_default(),
        ))
    } else {
        None
    })
}

/// The ROS 2 node and the robot's topics, when `[ros2]` asks for them (on the actor's bus).
pub(super) fn ros2_of<R: Robot + 'static>(
    b: &mut ActorBuilder<R>,
    spec: &RobotSpec,
    keys: &Keys,
) -> Result<Option<(reflex_ros2::Ros2Node, reflex_ros2::RobotTopics)>> {
    Ok(match (&b.ros2, &b.session) {
        (Some(cfg), Some(s)) => {
            let (node, topics) = reflex_ros2::start(s, cfg, spec, keys, b.stop.clone())?;
            b.rejects.extend(node.rejects.iter().cloned());
            Some((node, topics))
        }
        (Some(_), None) => {
            return Err(AgentError::setup(
                "[ros2]",
                "ROS 2 runs on the bus: give the actor a session (`[bus] enabled = true`)",
            ));
        }
        (None, _) => None,
    })
}

/// What a robot build (`--no-default-features`: no simulator) says when a config asks for it.
#[cfg(not(feature = "sim"))]
fn without_sim(key: &str) -> AgentError {
    AgentError::setup(
        key,
        "this reflex is the robot build, without the simulator (feature `sim`): run the \
         simulator from a workstation build (`reflex sim serve`) and connect to it with \
         [robot] source = \"remote\", or use a real arm",
    )
}
