//! Embedding reflex: your own robot type, an ONNX base policy, reflex's loop, residual learner
//! and recorder. Run it with `cargo run --release -p reflex-agent --example toy_arm`.
use reflex_agent::actor::{ActorBuilder, ClockChoice, LearnerSetup};
use reflex_contracts::prelude::*;
use reflex_contracts::robot::check_action;
use reflex_policies::onnx_policy::{OnnxPolicy, RunOptions};
use reflex_policies::onnx_write::{Dim, Elem, Graph, batch};

/// A planar 2-joint arm: joint velocities in, joint angles and the target out; success within
/// 0.05 rad of the target.
struct ToyArm {
    spec: RobotSpec,
    obs: Observation,
    q: [f32; 2],
    goal: [f32; 2],
    rng: u64,
}

impl ToyArm {
    fn new() -> Self {
        let spec = RobotSpec {
            v: reflex_contracts::msg::PROTOCOL_VERSION,
            name: "toy".into(),
            kind: "toy/2dof".into(),
            control_hz: 20.0,
            lockstep: true,
            state: vec![
                StateField::new("joint_pos", 2, "rad"),
                StateField::new("target", 2, "rad"),
            ],
            action: ActionSpec {
                kind: ActionKind::JointDelta,
                names: vec!["dq0".into(), "dq1".into()],
                low: vec![-0.1; 2],
                high: vec![0.1; 2],
            },
            cameras: vec![],
            joints: vec!["j0".into(), "j1".into()],
            max_episode_steps: 60,
            scene: None,
        };
        ToyArm {
            spec,
            obs: Observation::default(),
            q: [0.0; 2],
            goal: [0.0; 2],
            rng: 1,
        }
    }
    fn rand(&mut self) -> f32 {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.rng >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn fill(&mut self) {
        let err = (self.q[0] - self.goal[0])
            .abs()
            .max((self.q[1] - self.goal[1]).abs());
        self.obs.state = vec![self.q[0], self.q[1], self.goal[0], self.goal[1]];
        self.obs.success = err < 0.05;
        self.obs.reward = self.obs.success as u8 as f32;
        self.obs.terminated = self.obs.success;
        self.obs.truncated = self.obs.step >= self.spec.max_episode_steps;
    }
}

impl Robot for ToyArm {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError> {
        self.rng ^= seed.unwrap_or(0);
        (self.q, self.goal) = ([0.0; 2], [self.rand(), self.rand()]);
        self.obs.episode += 1;
        self.obs.step = 0;
        self.fill();
        Ok(&self.obs)
    }
    fn command(&mut self, a: &[f32]) -> Result<(), RobotError> {
        check_action("toy", 2, a)?;
        // A sticky joint: the second joint moves at 60% of the command.
        (self.q[0], self.q[1]) = (self.q[0] + a[0], self.q[1] + 0.6 * a[1]);
        self.obs.step += 1;
        self.fill();
        Ok(())
    }
    fn observe(&mut self) -> Result<&Observation, RobotError> {
        Ok(&self.obs)
    }
    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0);
    }
}

/// The base policy, a proportional controller exported to ONNX: chunk = 0.5 (target - q).
fn write_base(dir: &std::path::Path) -> std::path::PathBuf {
    let mut g = Graph::new();
    let x = g.input("state", Elem::F32, vec![batch(), Dim::Fixed(4)]);
    let y = g.linear(
        &x,
        &[-0.5, 0.0, 0.0, -0.5, 0.5, 0.0, 0.0, 0.5],
        &[0.0; 2],
        4,
        2,
    );
    let y = g.reshape(&y, &[-1, 1, 2]);
    g.output(
        &y,
        "actions",
        Elem::F32,
        vec![batch(), Dim::Fixed(1), Dim::Fixed(2)],
    );
    let model = dir.join("p_control.onnx");
    std::fs::write(&model, g.to_bytes("p_control", "toy_arm example")).unwrap();
    std::fs::write(
        dir.join("p_control.policy.toml"),
        "format = \"reflex-policy\"\nversion = 1\n\
        name = \"p_control\"\nkind = \"chunk\"\naction_dim = 2\nchunk_len = 1\nexecute = 1\n\
        [graph]\noutput = \"actions\"\n[[inputs]]\nsource = \"state\"\nname = \"state\"\n",
    )
    .unwrap();
    model
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(reflex_agent::run_id("toy-arm"));
    std::fs::create_dir_all(&dir)?;
    let model = write_base(&dir);
    let robot = ToyArm::new();
    let base = OnnxPolicy::load(&model, robot.spec(), &RunOptions::default())?;
    let mut section: reflex_agent::config::LearnerSection = toml::from_str("")?;
    section.checkpoint = dir.join("learner.ckpt");
    section.sac = Some(toml::from_str(
        "hidden = [32, 32]\nbatch = 64\nutd = 1\nwarmup_steps = 100",
    )?);
    let mut actor = ActorBuilder::new(robot)
        .policy(Box::new(base))
        .clock(ClockChoice::Sim)
        .seed(3)
        .learner(LearnerSetup {
            section,
            base_model: Some(model),
        })
        .record(dir.join("runs"))
        .build()?;
    let eps = actor
        .run_episodes(30, &reflex_agent::progress::Silent)?
        .to_vec();
    let report = actor.finish()?;
    let ok = |e: &[reflex_runtime::control::EpisodeSummary]| e.iter().filter(|e| e.success).count();
    println!(
        "first 10: {}/10 successes, last 10: {}/10; learner updates {}; episodes recorded in {}",
        ok(&eps[..10]),
        ok(&eps[20..]),
        report.learner.map_or(0, |l| l.updates),
        report
            .recording
            .map(|r| r.dir.display().to_string())
            .unwrap_or_default()
    );
    Ok(())
}
