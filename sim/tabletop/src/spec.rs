//! What the tabletop cell presents to a policy and a viewer, in the simulator and on the real
//! SO-101 alike: the observation's fields per task, the action spaces, the scene to draw.

use crate::model::{ARM_JOINTS, ARM_URDF, ArmModel};
use crate::sim_config::{SimConfig, StateView};
use crate::task::TaskKind;
use reflex_contracts::msg::{
    ActionKind, ActionSpec, ArmScene, CameraSpec, GripperScene, PROTOCOL_VERSION, RobotSpec,
    Scene as SceneSpec, SceneMarker, SceneObject, StateField, StaticBox,
};

/// The box the end-effector goal is kept in, m (base frame): in front of the arm, above the table.
pub const WORKSPACE_MIN: [f64; 3] = [0.06, -0.25, 0.005];
/// Upper corner of the end-effector goal box, m.
pub const WORKSPACE_MAX: [f64; 3] = [0.38, 0.25, 0.30];
/// Home yaw of the top-down tool orientation: at the zero pose the tool's x axis points back at
/// the base.
pub const HOME_YAW: f64 = std::f64::consts::PI;

/// What a viewer draws of a task: the SO-101 from its URDF with fingers opened by the gripper
/// value after the five arm joints, the object, the target, the tool path and the table.
pub fn scene(task: TaskKind) -> SceneSpec {
    let objects = if task.has_object() {
        vec![SceneObject {
            name: "object".into(),
            position_field: "object_pos".into(),
            quaternion_field: Some("object_quat".into()),
            half_extents_m: match task {
                TaskKind::Insert => [0.01; 3],
                _ => [0.015; 3],
            },
            rgb: [220, 40, 30],
        }]
    } else {
        vec![]
    };
    SceneSpec {
        arm: Some(ArmScene {
            urdf: ARM_URDF.to_string(),
            base_link: "base".into(),
            tool_link: "tcp".into(),
            joint_field: "joint_pos".into(),
            gripper: Some(GripperScene {
                opening_index: ARM_JOINTS.len() as u32,
                offset_m: 0.03,
            }),
        }),
        objects,
        markers: vec![SceneMarker {
            name: "target".into(),
            position_field: "target_pos".into(),
            radius_m: 0.008,
            rgb: [40, 200, 80],
        }],
        tool_path_field: Some("ee_pos".into()),
        static_boxes: vec![StaticBox {
            name: "table".into(),
            center_m: [0.2, 0.0, -0.01],
            half_extents_m: [0.3, 0.3, 0.01],
            rgb: [150, 120, 90],
        }],
    }
}

/// Values of the arm's own state (joint positions and velocities, tool position and
/// orientation), the first fields of every task's layout.
pub const ARM_STATE_LEN: usize = 19;

/// The arm's own fields of a task's layout (`[sim] state = "arm"`).
pub fn arm_state_fields(task: TaskKind) -> Vec<StateField> {
    let v: Vec<StateField> = state_fields(task)
        .into_iter()
        .take_while(|f| {
            matches!(
                f.name.as_str(),
                "joint_pos" | "joint_vel" | "ee_pos" | "ee_quat"
            )
        })
        .collect();
    debug_assert_eq!(
        v.iter().map(|f| f.size as usize).sum::<usize>(),
        ARM_STATE_LEN
    );
    v
}

/// Observation layout of a task.
pub fn state_fields(task: TaskKind) -> Vec<StateField> {
    let f = StateField::new;
    let mut v = vec![
        f(
            "joint_pos",
            6,
            "rad for the 5 arm joints, then gripper opening in m",
        ),
        f(
            "joint_vel",
            6,
            "rad/s for the 5 arm joints, then gripper opening rate in m/s",
        ),
        f("ee_pos", 3, "m, tool centre point in the base frame"),
        f(
            "ee_quat",
            4,
            "quaternion xyzw, tool orientation in the base frame",
        ),
    ];
    if task.has_object() {
        v.push(f("object_pos", 3, "m, object centre in the base frame"));
        v.push(f(
            "object_quat",
            4,
            "quaternion xyzw, object orientation in the base frame",
        ));
    }
    v.push(f(
        "target_pos",
        3,
        match task {
            TaskKind::Reach => "m, point to reach, base frame",
            TaskKind::Track => "m, where the moving target is now, base frame",
            TaskKind::Push => "m, centre of the goal region on the table, base frame",
            TaskKind::Pick => "m, cube start position raised by the required lift, base frame",
            TaskKind::Insert => "m, centre of the hole's opening, base frame",
        },
    ));
    v.push(f(
        "to_target",
        3,
        match task {
            TaskKind::Reach | TaskKind::Track => "m, target_pos - ee_pos, base frame",
            TaskKind::Push | TaskKind::Pick => "m, target_pos - object_pos, base frame",
            TaskKind::Insert => "m, target_pos - the peg's lower tip, base frame",
        },
    ));
    if task == TaskKind::Track {
        v.push(f(
            "target_vel",
            3,
            "m/s, the moving target's velocity, base frame",
        ));
    }
    v
}

/// The action space of `kind` on the arm `model` with these step sizes: what the simulator and
/// the real SO-101 profile (which shares its layout, so a policy moves between them) take.
pub fn action_space(
    kind: ActionKind,
    ee_step_m: f64,
    yaw_step_rad: f64,
    joint_step_rad: f64,
    model: &ArmModel,
) -> ActionSpec {
    let open = model.max_opening_m();
    let (names, low, high): (Vec<&str>, Vec<f32>, Vec<f32>) = match kind {
        ActionKind::EeDelta => {
            let s = ee_step_m as f32;
            (
                vec!["dx_m", "dy_m", "dz_m", "gripper_m"],
                vec![-s, -s, -s, 0.0],
                vec![s, s, s, open],
            )
        }
        ActionKind::EeDeltaYaw => {
            let (s, y) = (ee_step_m as f32, yaw_step_rad as f32);
            (
                vec!["dx_m", "dy_m", "dz_m", "dyaw_rad", "gripper_m"],
                vec![-s, -s, -s, -y, 0.0],
                vec![s, s, s, y, open],
            )
        }
        ActionKind::JointAbs => {
            let mut lo: Vec<f32> = model.limits.iter().map(|l| l.0 as f32).collect();
            let mut hi: Vec<f32> = model.limits.iter().map(|l| l.1 as f32).collect();
            lo.push(0.0);
            hi.push(open);
            (
                vec![
                    "shoulder_pan_rad",
                    "shoulder_lift_rad",
                    "elbow_flex_rad",
                    "wrist_flex_rad",
                    "wrist_roll_rad",
                    "gripper_m",
                ],
                lo,
                hi,
            )
        }
        ActionKind::JointDelta => {
            let s = joint_step_rad as f32;
            let g = 0.01;
            (
                vec![
                    "d_shoulder_pan_rad",
                    "d_shoulder_lift_rad",
                    "d_elbow_flex_rad",
                    "d_wrist_flex_rad",
                    "d_wrist_roll_rad",
                    "d_gripper_m",
                ],
                vec![-s, -s, -s, -s, -s, -g],
                vec![s, s, s, s, s, g],
            )
        }
        ActionKind::Box => (vec![], vec![], vec![]),
    };
    ActionSpec {
        kind,
        names: names.into_iter().map(String::from).collect(),
        low,
        high,
    }
}

/// The simulator's robot spec for `cfg` on the arm `model`, with `cameras` (the simulator's rig
/// renders them; a build without the simulator describes the robot with none).
pub fn robot_spec(cfg: &SimConfig, model: &ArmModel, cameras: Vec<CameraSpec>) -> RobotSpec {
    RobotSpec {
        v: PROTOCOL_VERSION,
        name: cfg.robot.clone(),
        kind: format!("sim/{}", cfg.task),
        control_hz: cfg.control_hz,
        lockstep: true,
        state: match cfg.state {
            StateView::All => state_fields(cfg.task),
            StateView::Arm => arm_state_fields(cfg.task),
        },
        action: action_space(
            cfg.action,
            cfg.ee_step_m,
            cfg.yaw_step_rad,
            cfg.joint_step_rad,
            model,
        ),
        cameras,
        joints: ARM_JOINTS
            .iter()
            .map(|s| s.to_string())
            .chain(["gripper".to_string()])
            .collect(),
        max_episode_steps: cfg.max_steps(),
        scene: Some(match cfg.state {
            StateView::All => scene(cfg.task),
            // A viewer draws objects and markers from state fields the robot no longer has.
            StateView::Arm => SceneSpec {
                objects: vec![],
                markers: vec![],
                ..scene(cfg.task)
            },
        }),
    }
}
