//! The robot's own topics, fed from the outbox's consumer thread (never the loop's): joint
//! states, TF and camera images, from every step while an episode runs and from the loop's held
//! ticks while the e-stop holds the robot.
//!
//! Why the held ticks (found testing against an independent ROS 2 client): the loop sends no
//! steps while it is stopped, so `joint_states`, `/tf` and the images stopped exactly when a
//! person needs RViz, MoveIt and TF listeners to see the robot. The loop now hands its held
//! observations on ([`Held`]); they come here and nowhere else (they are no steps: the recorder
//! and the learner never see them), and `/diagnostics` says the robot is stopped.

use crate::msgs::{self, Time, Transform};
use crate::pace::Pace;
use crate::{IMAGE_QOS, NodeCtx, Pub, Ros2Error, STATE_QOS, TF_QOS};
use reflex_contracts::msg::{Image, RobotSpec};
use reflex_runtime::kinematics::{Chain, JointKind, joint_motion, urdf_pose};
use reflex_runtime::outbox::{Frames, Held, Transition};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

struct JointTopic {
    publisher: Pub,
    names: Vec<String>,
    position: Range<usize>,
    velocity: Option<Range<usize>>,
}

struct TfTopic {
    publisher: Pub,
    chain: Chain,
    joints: Range<usize>,
    q: Vec<f64>,
    poses: Vec<nalgebra::Isometry3<f64>>,
    /// One per movable joint (its child link in the link before), then the tool, then each
    /// camera with a known mount.
    transforms: Vec<Transform>,
    /// The tool link is not the last joint's child: its transform follows the joints'.
    tool: bool,
    /// The URDF's other joints (fingers, fixed parts), after the cameras.
    extras: Vec<Extra>,
}

/// A URDF joint outside the chain, so that every link of the robot's model is in TF (RViz's
/// robot model needs them all).
struct Extra {
    /// Its transform's place in [`TfTopic::transforms`].
    at: usize,
    origin: nalgebra::Isometry3<f64>,
    /// How it moves; none for a fixed joint.
    motion: Option<Motion>,
}

/// A moving joint outside the chain.
struct Motion {
    kind: JointKind,
    axis: nalgebra::Unit<nalgebra::Vector3<f64>>,
    /// Where its value comes from: a state index and a scale (0 when the state does not say).
    source: Option<(usize, f64)>,
}

/// The URDF's joints whose child link the chain does not publish, appended to `transforms`.
/// A moving joint takes its value from the spec's joint of the same name, or, for a prismatic
/// finger of a parallel gripper (the scene's `gripper`), half the gripper's opening.
fn extra_joints(
    urdf: &urdf_rs::Robot,
    spec: &RobotSpec,
    node: &NodeCtx,
    transforms: &mut Vec<Transform>,
) -> Vec<Extra> {
    let arm = spec.scene.as_ref().and_then(|s| s.arm.as_ref());
    let pos = arm.and_then(|a| spec.field(&a.joint_field));
    let opening = arm
        .and_then(|a| a.gripper.as_ref())
        .map(|g| g.opening_index as usize);
    let mut out = Vec::new();
    for j in &urdf.joints {
        let child = node.frame(&j.child.link);
        if transforms.iter().any(|t| t.child == child) {
            continue;
        }
        let named = spec.joints.iter().position(|n| *n == j.name);
        let source = match (named, &pos, opening) {
            (Some(i), Some(r), _) if i < r.len() => Some((r.start + i, 1.0)),
            (_, _, Some(o)) if j.joint_type == urdf_rs::JointType::Prismatic => Some((o, 0.5)),
            _ => None,
        };
        let axis = nalgebra::Vector3::new(j.axis.xyz[0], j.axis.xyz[1], j.axis.xyz[2]);
        let motion = (j.joint_type != urdf_rs::JointType::Fixed).then(|| Motion {
            kind: if j.joint_type == urdf_rs::JointType::Prismatic {
                JointKind::Prismatic
            } else {
                JointKind::Revolute
            },
            axis: nalgebra::Unit::new_normalize(axis),
            source,
        });
        let origin = urdf_pose(&j.origin);
        let (translation, rotation_xyzw) = iso_parts(&origin);
        out.push(Extra {
            at: transforms.len(),
            origin,
            motion,
        });
        transforms.push(Transform {
            parent: node.frame(&j.parent.link),
            child,
            translation,
            rotation_xyzw,
        });
    }
    out
}

struct CameraTopic {
    image: Pub,
    info: Pub,
    frame: String,
    pinhole: Option<[f64; 4]>,
}

/// The publishers fed from the outbox's consumer thread: joint states, TF, camera images.
pub struct RobotTopics {
    joints: Option<JointTopic>,
    tf: Option<TfTopic>,
    cameras: Vec<CameraTopic>,
    /// Joint states and TF every this many steps (`state_hz`).
    every: u32,
    /// Joint states and TF of held ticks at `state_hz` (held ticks have no step number).
    held_state: Pace,
    /// Images at `image_hz`, steps and held ticks alike.
    images: Pace,
    w: crate::cdr::Writer,
    pub(crate) gripper: Option<(usize, Arc<AtomicU32>)>,
    counters: Arc<TopicCounters>,
}

/// What the robot's topics published, for the tests and the run's report.
#[derive(Debug, Default)]
pub struct TopicCounters {
    /// Joint states (and TF with them) from steps of an episode.
    pub states: std::sync::atomic::AtomicU64,
    /// Joint states (and TF with them) from held ticks: the e-stop held the robot.
    pub held_states: std::sync::atomic::AtomicU64,
    /// Image sets (every camera's image and camera info), from steps and held ticks.
    pub images: std::sync::atomic::AtomicU64,
    /// Image sets from held ticks.
    pub held_images: std::sync::atomic::AtomicU64,
}

fn iso_parts(t: &nalgebra::Isometry3<f64>) -> ([f64; 3], [f64; 4]) {
    let v = t.translation.vector;
    let q = t.rotation.coords;
    ([v.x, v.y, v.z], [q.x, q.y, q.z, q.w])
}

impl RobotTopics {
    pub(crate) fn new(node: &NodeCtx, spec: &RobotSpec) -> Result<Self, Ros2Error> {
        let scene_arm = spec.scene.as_ref().and_then(|s| s.arm.as_ref());
        let joints = joint_topic(node, spec, scene_arm)?;
        let tf = match scene_arm {
            Some(a) => Some(tf_topic(node, spec, a)?),
            None => None,
        };
        let cameras = spec
            .cameras
            .iter()
            .map(|c| camera_topic(node, c))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RobotTopics {
            joints,
            tf,
            cameras,
            every: (spec.control_hz / node.cfg.state_hz).round().max(1.0) as u32,
            held_state: Pace::hz(node.cfg.state_hz),
            images: Pace::hz(node.cfg.image_hz),
            w: crate::cdr::Writer::new(),
            gripper: None,
            counters: Arc::new(TopicCounters::default()),
        })
    }

    /// What the topics published so far (shared: it stays readable after the topics move to
    /// the outbox's thread).
    pub fn counters(&self) -> Arc<TopicCounters> {
        self.counters.clone()
    }

    /// Held ticks to skip between two the loop hands on ([`reflex_runtime::control::ControlLoopBuilder::held`]):
    /// one in every this many is enough for `state_hz`.
    pub fn held_every(&self) -> u32 {
        self.every
    }

    /// Publishes the step's joint states and TF if they are due (every step that ends an
    /// episode, and every k-th step for `state_hz`).
    pub fn offer(&mut self, t: &Transition) {
        if let Some((i, g)) = &self.gripper
            && let Some(&v) = t.action.get(*i)
        {
            g.store(v.to_bits(), Ordering::Relaxed);
        }
        if !t.ends_episode() && !t.step.is_multiple_of(self.every) {
            return;
        }
        // The state after the step: where the robot is now.
        if self.publish_state(&t.next_obs) {
            self.counters.states.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Publishes the cameras' images and their `CameraInfo` if they are due (`image_hz`, by
    /// deadline on the loop's clock: [`Pace`]).
    pub fn offer_frames(&mut self, f: &Frames) {
        if !self.cameras.is_empty() && self.images.due(f.t) {
            self.publish_images(&f.images);
        }
    }

    /// A tick that belongs to no episode (the e-stop latched, or released and waiting for a
    /// resume): the robot is still there, so its joint states, TF (at `state_hz`) and images (at
    /// `image_hz`, when the tick carries them) go out as while it runs.
    pub fn offer_held(&mut self, h: &Held) {
        if self.held_state.due(h.t) && self.publish_state(&h.state) {
            self.counters.held_states.fetch_add(1, Ordering::Relaxed);
        }
        if h.fresh_images
            && !self.cameras.is_empty()
            && !h.images.is_empty()
            && self.images.due(h.t)
        {
            self.publish_images(&h.images);
            self.counters.held_images.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Joint states and TF of the robot in state `s`; whether anything went out.
    fn publish_state(&mut self, s: &[f32]) -> bool {
        let stamp = Time::now();
        let mut sent = false;
        if let Some(j) = &mut self.joints
            && s.len() >= j.position.end
        {
            msgs::JointState {
                stamp,
                frame_id: "",
                name: &j.names,
                position: &s[j.position.clone()],
                velocity: j
                    .velocity
                    .clone()
                    .filter(|v| s.len() >= v.end)
                    .map_or(&[][..], |v| &s[v]),
            }
            .write(&mut self.w);
            j.publisher.put(self.w.bytes());
            sent = true;
        }
        if let Some(tf) = &mut self.tf
            && s.len() >= tf.joints.end
        {
            tf.pose(s);
            msgs::write_tf(&mut self.w, stamp, &tf.transforms);
            tf.publisher.put(self.w.bytes());
            sent = true;
        }
        sent
    }

    /// Every camera's image and `CameraInfo`, in the robot's camera order.
    fn publish_images(&mut self, images: &[Image]) {
        let stamp = Time::now();
        for (c, img) in self.cameras.iter_mut().zip(images) {
            msgs::write_image(&mut self.w, stamp, &c.frame, img);
            c.image.put(self.w.bytes());
            msgs::write_camera_info(
                &mut self.w,
                stamp,
                &c.frame,
                (img.width, img.height),
                c.pinhole,
            );
            c.info.put(self.w.bytes());
        }
        self.counters.images.fetch_add(1, Ordering::Relaxed);
    }
}

impl TfTopic {
    /// Poses every transform for the robot in state `s` (forward kinematics of the chain, then
    /// the URDF's joints outside it).
    fn pose(&mut self, s: &[f32]) {
        for (q, &v) in self.q.iter_mut().zip(&s[self.joints.clone()]) {
            *q = v as f64;
        }
        self.chain.link_poses(&self.q, &mut self.poses);
        let mut before = nalgebra::Isometry3::identity();
        for (k, pose) in self.poses.iter().enumerate() {
            (
                self.transforms[k].translation,
                self.transforms[k].rotation_xyzw,
            ) = iso_parts(&(before.inverse() * pose));
            before = *pose;
        }
        if self.tool {
            let dof = self.poses.len();
            (
                self.transforms[dof].translation,
                self.transforms[dof].rotation_xyzw,
            ) = iso_parts(&(before.inverse() * self.chain.fk(&self.q)));
        }
        for e in &self.extras {
            let Some(m) = &e.motion else {
                continue;
            };
            let q = m
                .source
                .map_or(0.0, |(i, k)| s.get(i).map_or(0.0, |&v| v as f64 * k));
            let t = &mut self.transforms[e.at];
            (t.translation, t.rotation_xyzw) =
                iso_parts(&(e.origin * joint_motion(m.kind, &m.axis, q)));
        }
    }
}

/// `joint_states` from the state field holding the joints' positions (and `joint_vel` when
/// there is one); none, with a warning, when the robot reports no such field.
fn joint_topic(
    node: &NodeCtx,
    spec: &RobotSpec,
    scene_arm: Option<&reflex_contracts::msg::ArmScene>,
) -> Result<Option<JointTopic>, Ros2Error> {
    let pos_field = scene_arm.map_or("joint_pos", |a| a.joint_field.as_str());
    let n = spec.joints.len();
    Ok(match spec.field(pos_field) {
        Some(r) if n > 0 && r.len() >= n => Some(JointTopic {
            publisher: Pub::declare(
                node,
                &node.topic("joint_states"),
                &msgs::JOINT_STATE,
                STATE_QOS,
            )?,
            names: spec.joints.clone(),
            position: r.start..r.start + n,
            velocity: spec
                .field("joint_vel")
                .filter(|v| v.len() >= n)
                .map(|v| v.start..v.start + n),
        }),
        _ => {
            tracing::warn!(
                "ROS 2: robot `{}` has no state field `{pos_field}` with its {n} joints: no joint_states",
                spec.name
            );
            None
        }
    })
}

/// `/tf` of the arm's chain from its URDF: a transform per joint, the tool, the mounted
/// cameras' optical frames and the URDF's other joints.
fn tf_topic(
    node: &NodeCtx,
    spec: &RobotSpec,
    a: &reflex_contracts::msg::ArmScene,
) -> Result<TfTopic, Ros2Error> {
    let model = |message: String| Ros2Error::Model {
        robot: spec.name.clone(),
        message,
    };
    let chain = Chain::from_urdf_str(&a.urdf, &spec.name, &a.base_link, &a.tool_link)
        .map_err(|e| model(e.to_string()))?;
    let dof = chain.dof();
    let joints = spec
        .field(&a.joint_field)
        .filter(|r| r.len() >= dof)
        .map(|r| r.start..r.start + dof)
        .ok_or_else(|| {
            model(format!(
                "no state field `{}` of {dof} values",
                a.joint_field
            ))
        })?;
    let mut transforms = Vec::new();
    let mut parent = a.base_link.clone();
    for j in chain.joints() {
        transforms.push(Transform {
            parent: node.frame(&parent),
            child: node.frame(&j.child_link),
            translation: [0.0; 3],
            rotation_xyzw: [0.0, 0.0, 0.0, 1.0],
        });
        parent = j.child_link.clone();
    }
    let tool = a.tool_link != parent;
    if tool {
        transforms.push(Transform {
            parent: node.frame(&parent),
            child: node.frame(&a.tool_link),
            translation: [0.0; 3],
            rotation_xyzw: [0.0, 0.0, 0.0, 1.0],
        });
    }
    for c in &spec.cameras {
        if let Some(m) = &c.mount {
            let p = if m.parent == "base" {
                a.base_link.as_str()
            } else {
                m.parent.as_str()
            };
            transforms.push(Transform {
                parent: node.frame(p),
                child: node.frame(&format!("{}_optical_frame", c.name)),
                translation: m.translation_m,
                rotation_xyzw: m.rotation_xyzw,
            });
        }
    }
    let urdf = urdf_rs::read_from_string(&a.urdf).map_err(|e| model(e.to_string()))?;
    let extras = extra_joints(&urdf, spec, node, &mut transforms);
    Ok(TfTopic {
        publisher: Pub::declare(node, "/tf", &msgs::TF_MESSAGE, TF_QOS)?,
        extras,
        q: vec![0.0; dof],
        poses: vec![nalgebra::Isometry3::identity(); dof],
        chain,
        joints,
        transforms,
        tool,
    })
}

/// A camera's `image_raw` and `camera_info`.
fn camera_topic(
    node: &NodeCtx,
    c: &reflex_contracts::msg::CameraSpec,
) -> Result<CameraTopic, Ros2Error> {
    Ok(CameraTopic {
        image: Pub::declare(
            node,
            &node.topic(&format!("{}/image_raw", c.name)),
            &msgs::IMAGE,
            IMAGE_QOS,
        )?,
        info: Pub::declare(
            node,
            &node.topic(&format!("{}/camera_info", c.name)),
            &msgs::CAMERA_INFO,
            IMAGE_QOS,
        )?,
        frame: node.frame(&format!("{}_optical_frame", c.name)),
        pinhole: c.intrinsics,
    })
}
