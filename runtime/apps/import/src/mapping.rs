//! LeRobot's features onto the robot: `observation.state` onto its state fields,
//! `observation.images.<cam>` onto camera `<cam>`, and `--map feature=name` where the names
//! differ. Checked before the export, so a feature the robot does not have is an error in a
//! second, not after a minute of torch.

use crate::ImportError;
use crate::checkpoint::{Checkpoint, Feature, FeatureKind};
use reflex_runtime::msg::RobotSpec;

/// Where one of the policy's input features comes from on the robot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// State fields, concatenated in order (empty: the whole state vector).
    State {
        /// The policy's feature key (also the graph input's name).
        feature: String,
        /// The robot's state fields.
        fields: Vec<String>,
    },
    /// A camera, read at the feature's size.
    Image {
        /// The policy's feature key (also the graph input's name).
        feature: String,
        /// The robot's camera.
        camera: String,
        /// Width the policy reads.
        width: u32,
        /// Height the policy reads.
        height: u32,
    },
}

impl Binding {
    /// The policy's feature key.
    pub fn feature(&self) -> &str {
        match self {
            Binding::State { feature, .. } | Binding::Image { feature, .. } => feature,
        }
    }
}

/// The state fields of `robot` with their sizes, for messages: `joint_pos (6), ee_pos (3)`.
fn state_listing(robot: &RobotSpec) -> String {
    robot
        .state
        .iter()
        .map(|f| format!("{} ({})", f.name, f.size))
        .collect::<Vec<_>>()
        .join(", ")
}

fn cameras(robot: &RobotSpec) -> Vec<&str> {
    robot.cameras.iter().map(|c| c.name.as_str()).collect()
}

/// Binds every input feature of `ckpt` to `robot`, with `maps` (`(feature, robot name)`, the
/// feature named by the policy's key or the robot-side key the preprocessor renames), and checks
/// the action's size. `notes` receives what the user should know but is not an error (a camera
/// of another size, which reflex resizes).
///
/// # Errors
/// [`ImportError::Mapping`] naming the feature and what to pass.
pub fn bind(
    ckpt: &Checkpoint,
    robot: &RobotSpec,
    maps: &[(String, String)],
    notes: &mut Vec<String>,
) -> Result<Vec<Binding>, ImportError> {
    let robot_name = &robot.kind;
    for (k, _) in maps {
        if !ckpt
            .inputs
            .iter()
            .any(|f| f.key == *k || ckpt.robot_key(&f.key) == k)
        {
            return Err(ImportError::Mapping(format!(
                "--map {k}=...: the checkpoint has no input feature `{k}`; its input features are {:?}",
                ckpt.inputs.iter().map(|f| &f.key).collect::<Vec<_>>()
            )));
        }
    }
    let mut out = Vec::with_capacity(ckpt.inputs.len());
    for f in &ckpt.inputs {
        let rk = ckpt.robot_key(&f.key);
        let mapped = maps
            .iter()
            .rev()
            .find(|(k, _)| *k == f.key || k == rk)
            .map(|(_, v)| v.as_str());
        out.push(match &f.kind {
            FeatureKind::State | FeatureKind::Env => bind_state(f, rk, mapped, robot)?,
            FeatureKind::Visual => bind_image(f, rk, mapped, robot, notes)?,
            FeatureKind::Action | FeatureKind::Other(_) => {
                return Err(ImportError::Mapping(format!(
                    "input feature `{}` is of type {:?}, which reflex does not feed yet (it feeds STATE, ENV and VISUAL features)",
                    f.key, f.kind
                )));
            }
        });
    }
    let want = ckpt.action.numel();
    if want != robot.action.dim() {
        return Err(ImportError::Mapping(format!(
            "the policy's `{}` has {want} components; robot `{robot_name}` takes {} ({}): this policy was made for another robot",
            ckpt.action.key,
            robot.action.dim(),
            robot.action.names.join(", ")
        )));
    }
    Ok(out)
}

fn bind_state(
    f: &Feature,
    robot_key: &str,
    mapped: Option<&str>,
    robot: &RobotSpec,
) -> Result<Binding, ImportError> {
    let fields: Vec<String> = match mapped {
        Some(v) => v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        None if robot_key == "observation.state" => vec![],
        None => {
            return Err(ImportError::Mapping(format!(
                "feature `{robot_key}` ({} values) has no counterpart on robot `{}` by name: \
                 name the state fields it holds with --map {robot_key}=FIELD,FIELD (the robot's: {})",
                f.numel(),
                robot.kind,
                state_listing(robot)
            )));
        }
    };
    let mut n = 0;
    for name in &fields {
        let r = robot.field(name).ok_or_else(|| {
            ImportError::Mapping(format!(
                "feature `{robot_key}` is mapped to state field `{name}`, which robot `{}` does not have (it has {})",
                robot.kind,
                state_listing(robot)
            ))
        })?;
        n += r.len();
    }
    if fields.is_empty() {
        n = robot.state_dim();
    }
    if f.shape.len() != 1 || n != f.numel() {
        let held = if fields.is_empty() {
            format!("the whole state of robot `{}`", robot.kind)
        } else {
            format!("state fields {}", fields.join(","))
        };
        return Err(ImportError::Mapping(format!(
            "feature `{robot_key}` has shape {:?}; {held} hold {n} values: name the fields it holds \
             with --map {robot_key}=FIELD,FIELD (the robot's: {})",
            f.shape,
            state_listing(robot)
        )));
    }
    Ok(Binding::State {
        feature: f.key.clone(),
        fields,
    })
}

fn bind_image(
    f: &Feature,
    robot_key: &str,
    mapped: Option<&str>,
    robot: &RobotSpec,
    notes: &mut Vec<String>,
) -> Result<Binding, ImportError> {
    let camera = match mapped.or_else(|| robot_key.strip_prefix("observation.images.")) {
        Some(c) => c.to_string(),
        None => {
            return Err(ImportError::Mapping(format!(
                "image feature `{robot_key}` names no camera: map it with --map {robot_key}=CAMERA (robot `{}` has cameras {:?})",
                robot.kind,
                cameras(robot)
            )));
        }
    };
    let Some(cam) = robot.cameras.iter().find(|c| c.name == camera) else {
        return Err(ImportError::Mapping(format!(
            "feature `{robot_key}` needs camera `{camera}`, which robot `{}` does not have (its cameras: {:?}); \
             map it to one with --map {robot_key}=CAMERA",
            robot.kind,
            cameras(robot)
        )));
    };
    let [3, h, w] = f.shape[..] else {
        return Err(ImportError::Mapping(format!(
            "image feature `{robot_key}` has shape {:?}; reflex feeds colour images [3, height, width]",
            f.shape
        )));
    };
    let (w, h) = (w as u32, h as u32);
    if (cam.width, cam.height) != (w, h) {
        notes.push(format!(
            "camera `{camera}` gives {}x{} images, the policy reads {w}x{h}: reflex resizes them \
             (bilinear); LeRobot's ACT takes the camera's own size, so check this is the camera it was trained with",
            cam.width, cam.height
        ));
    }
    Ok(Binding::Image {
        feature: f.key.clone(),
        camera,
        width: w,
        height: h,
    })
}
