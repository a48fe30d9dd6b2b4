//! Embedding reflex: your own robot type, an ONNX base policy, reflex's loop, residual learner
//! and recorder, from the front door alone (`reflex_agent::prelude`, typed configs, no TOML).
//! Run it with `cargo run --release -p reflex-agent --example toy_arm`. It shows the wiring, not
//! a result: 40 sparse-reward episodes are too few for the residual to help this toy (it prints
//! what it measured; `reflex demo` shows a lift with a person correcting).
use reflex_agent::onnx_write::{Dim, Elem, Graph, batch};
use reflex_agent::prelude::*;

/// A planar 2-joint arm: joint steps in; joint angles and the target out. Success: both joints
/// within 0.05 rad of the target. Its second joint is slow: it moves 60% of each step.
struct ToyArm {
    spec: RobotSpec,
    obs: Observation,
    q: [f32; 2],
    goal: [f32; 2],
}

impl ToyArm {
    fn update(&mut self) -> Result<&Observation, RobotError> {
        let err = (0..2)
            .map(|i| (self.q[i] - self.goal[i]).abs())
            .fold(0.0, f32::max);
        let o = &mut self.obs;
        o.state = vec![self.q[0], self.q[1], self.goal[0], self.goal[1]];
        (o.success, o.terminated) = (err < 0.05, err < 0.05);
        o.reward = o.success as u8 as f32;
        o.truncated = o.step >= self.spec.max_episode_steps;
        Ok(&self.obs)
    }
}

impl Robot for ToyArm {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }
    fn reset(&mut self, seed: Option<u64>) -> Result<&Observation, RobotError> {
        self.goal = goal_for(seed.unwrap_or(0));
        (self.q, self.obs.step) = ([0.0; 2], 0);
        self.obs.episode += 1;
        self.update()
    }
    fn command(&mut self, a: &[f32]) -> Result<(), RobotError> {
        check_action("toy", 2, a)?;
        (self.q[0], self.q[1]) = (self.q[0] + a[0], self.q[1] + 0.6 * a[1]);
        self.obs.step += 1;
        self.update().map(|_| ())
    }
    fn observe(&mut self) -> Result<&Observation, RobotError> {
        Ok(&self.obs)
    }
    fn hold_action(&self, out: &mut [f32]) {
        out.fill(0.0);
    }
}

/// The episode's target, two angles in [-1, 1) rad from its seed (SplitMix64's mixing).
fn goal_for(seed: u64) -> [f32; 2] {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let unit = |z: u64| (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
    let a = mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
    [unit(a), unit(mix(a))]
}

/// The base policy, a proportional controller exported to ONNX: step = 0.5 (target - q).
fn write_base(dir: &std::path::Path) -> std::path::PathBuf {
    let mut g = Graph::new();
    let x = g.input("state", Elem::F32, vec![batch(), Dim::Fixed(4)]);
    let w = [-0.5, 0.0, 0.0, -0.5, 0.5, 0.0, 0.0, 0.5];
    let y = g.linear(&x, &w, &[0.0; 2], 4, 2);
    let y = g.reshape(&y, &[-1, 1, 2]);
    let dims = vec![batch(), Dim::Fixed(1), Dim::Fixed(2)];
    g.output(&y, "actions", Elem::F32, dims);
    let model = dir.join("p_control.onnx");
    std::fs::write(&model, g.to_bytes("p_control", "toy_arm example")).unwrap();
    // Two actions, one per chunk, all executed; the robot's whole state at the input `state`.
    PolicySpec::chunk("p_control", (2, 1, 1), "state", "actions")
        .write_for(&model)
        .unwrap();
    model
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(reflex_agent::run_id("toy-arm"));
    std::fs::create_dir_all(&dir)?;
    let model = write_base(&dir);
    let spec = RobotSpec::new("toy", "toy/2dof", 20.0)
        .with_state("joint_pos", 2, "rad")
        .with_state("target", 2, "rad")
        .with_action(ActionKind::JointDelta, &["dq0", "dq1"], -0.1, 0.1)
        .with_max_episode_steps(60);
    let base = OnnxPolicy::load(&model, &spec, &PolicyOptions::default())?;
    let (q, goal, obs) = ([0.0; 2], [0.0; 2], Observation::default());
    let robot = ToyArm { spec, obs, q, goal };
    // The residual SAC learner on a thread of this process, small nets for a small problem.
    let section = LearnerSection {
        checkpoint: dir.join("learner.ckpt"),
        ..Default::default()
    }
    .with_sac(&SacConfig {
        hidden: vec![32, 32],
        batch: 64,
        ..SacConfig::default()
    });
    let setup = LearnerSetup {
        section,
        base_model: Some(model),
    };
    let mut actor = ActorBuilder::new(robot)
        .policy(Box::new(base))
        .clock(ClockChoice::Sim)
        .seed(3)
        .learner(setup)
        .record(dir.join("runs"))
        .build()?;
    let train = actor.run_episodes(40, &Silent)?.to_vec();
    let eval = actor.evaluate(10, &Silent)?.to_vec();
    let runs = actor.finish()?.recording.map(|r| r.dir).unwrap_or_default();
    let ok = |e: &[EpisodeSummary]| e.iter().filter(|e| e.success).count();
    let (first, last) = (ok(&train[..10]), ok(&train[30..]));
    println!(
        "training {first}/10 -> {last}/10, evaluation {}/10, episodes in {runs:?}",
        ok(&eval)
    );
    Ok(())
}
