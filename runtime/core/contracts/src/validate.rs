//! Checks of what arrives from another process before anything indexes into it: a robot's spec
//! when a controller connects, every observation against that spec, every command against the
//! action space. A message that fails is rejected with an error that names the robot, the field
//! and what was wrong; nothing downstream has to trust lengths again.

use crate::keys::Keys;
use crate::msg::{Observation, RobotSpec};

/// Largest state vector, action vector and camera side accepted from a peer: far above any real
/// robot, low enough that a hostile message cannot make a receiver allocate gigabytes.
pub const MAX_STATE: usize = 1 << 16;
/// Largest action dimension accepted.
pub const MAX_ACTION: usize = 1 << 10;
/// Largest camera width or height, pixels.
pub const MAX_CAMERA_SIDE: u32 = 8192;
/// Most cameras per robot.
pub const MAX_CAMERAS: usize = 16;

/// A robot description that cannot be driven safely.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("robot spec of `{robot}`: {what}")]
pub struct SpecError {
    /// The robot's name as given.
    pub robot: String,
    /// What is wrong, naming the field.
    pub what: String,
}

/// An observation that does not match its robot's spec.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("observation of `{robot}`: {what}")]
pub struct ObservationError {
    /// The robot.
    pub robot: String,
    /// What is wrong, naming the field.
    pub what: String,
}

/// What is wrong with a spec, before the robot's name is attached.
struct Problem(String);

impl From<String> for Problem {
    fn from(s: String) -> Self {
        Problem(s)
    }
}

fn unique<'a>(what: &str, names: impl Iterator<Item = &'a String>) -> Result<(), Problem> {
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        if n.is_empty() {
            return Err(Problem(format!("{what}: an empty name")));
        }
        if !seen.insert(n.as_str()) {
            return Err(Problem(format!("{what}: `{n}` appears twice")));
        }
    }
    Ok(())
}

impl RobotSpec {
    /// Checks that the spec describes something a controller can drive: a usable name, a
    /// positive finite rate, state fields with sizes and unique names (and, where given, one
    /// ordered bound per value), an action space whose names and finite, ordered bounds agree in
    /// length, cameras of sane size, and a scene that refers to existing state fields.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.check().map_err(|p| SpecError {
            robot: self.name.clone(),
            what: p.0,
        })
    }

    fn check(&self) -> Result<(), Problem> {
        Keys::new(&self.name).map_err(|e| Problem(e.to_string()))?;
        if !(self.control_hz.is_finite() && self.control_hz > 0.0 && self.control_hz <= 10_000.0) {
            return Err(Problem(format!(
                "control_hz = {} (allowed: above 0, at most 10000)",
                self.control_hz
            )));
        }
        self.check_state()?;
        self.check_action()?;
        if self.cameras.len() > MAX_CAMERAS {
            return Err(Problem(format!(
                "{} cameras (at most {MAX_CAMERAS})",
                self.cameras.len()
            )));
        }
        unique("cameras", self.cameras.iter().map(|c| &c.name))?;
        for c in &self.cameras {
            let ok = |v: u32| (1..=MAX_CAMERA_SIDE).contains(&v);
            if !ok(c.width) || !ok(c.height) {
                return Err(Problem(format!(
                    "camera `{}` is {}x{} (each side 1 ..= {MAX_CAMERA_SIDE})",
                    c.name, c.width, c.height
                )));
            }
            if let Some(k) = c.intrinsics
                && !(k.iter().all(|v| v.is_finite()) && k[0] > 0.0 && k[1] > 0.0)
            {
                return Err(Problem(format!(
                    "camera `{}` has intrinsics {k:?} (fx, fy > 0, all finite)",
                    c.name
                )));
            }
            if let Some(m) = &c.mount {
                let norm = m.rotation_xyzw.iter().map(|q| q * q).sum::<f64>().sqrt();
                let finite = m.translation_m.iter().all(|v| v.is_finite());
                if m.parent.is_empty() || !finite || !(0.99..=1.01).contains(&norm) {
                    return Err(Problem(format!(
                        "camera `{}` has mount {m:?} (a parent frame, a finite translation, a unit quaternion)",
                        c.name
                    )));
                }
            }
        }
        self.check_scene()
    }

    fn check_state(&self) -> Result<(), Problem> {
        unique("state fields", self.state.iter().map(|f| &f.name))?;
        let mut total = 0usize;
        for f in &self.state {
            if f.size == 0 {
                return Err(Problem(format!("state field `{}` has size 0", f.name)));
            }
            total = total.saturating_add(f.size as usize);
            for (which, b) in [("low", &f.low), ("high", &f.high)] {
                if let Some(b) = b
                    && b.len() != f.size as usize
                {
                    return Err(Problem(format!(
                        "state field `{}` has {} `{which}` bounds for {} values",
                        f.name,
                        b.len(),
                        f.size
                    )));
                }
            }
            if let (Some(lo), Some(hi)) = (&f.low, &f.high)
                && let Some(i) =
                    (0..lo.len()).find(|&i| lo[i].is_nan() || hi[i].is_nan() || lo[i] > hi[i])
            {
                return Err(Problem(format!(
                    "state field `{}` value {i}: low {} is not <= high {}",
                    f.name, lo[i], hi[i]
                )));
            }
        }
        if total > MAX_STATE {
            return Err(Problem(format!(
                "state has {total} values (at most {MAX_STATE})"
            )));
        }
        Ok(())
    }

    fn check_action(&self) -> Result<(), Problem> {
        let a = &self.action;
        let n = a.names.len();
        if n == 0 || n > MAX_ACTION {
            return Err(Problem(format!(
                "action has {n} components (allowed 1 ..= {MAX_ACTION})"
            )));
        }
        if a.low.len() != n || a.high.len() != n {
            return Err(Problem(format!(
                "action has {n} names but {} low and {} high bounds",
                a.low.len(),
                a.high.len()
            )));
        }
        unique("action names", a.names.iter())?;
        for i in 0..n {
            let (lo, hi) = (a.low[i], a.high[i]);
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(Problem(format!(
                    "action `{}` bounds [{lo}, {hi}] must be finite with low <= high",
                    a.names[i]
                )));
            }
        }
        Ok(())
    }

    fn check_scene(&self) -> Result<(), Problem> {
        let Some(s) = &self.scene else { return Ok(()) };
        let field = |name: &str, size: usize| match self.field(name) {
            Some(r) if r.len() >= size => Ok(()),
            Some(r) => Err(Problem(format!(
                "scene: state field `{name}` has {} values, needs {size}",
                r.len()
            ))),
            None => Err(Problem(format!("scene: no state field `{name}`"))),
        };
        if let Some(arm) = &s.arm {
            field(&arm.joint_field, 1)?;
            if let Some(g) = &arm.gripper
                && g.opening_index as usize >= self.state_dim()
            {
                return Err(Problem(format!(
                    "scene: gripper opening index {} is outside the state ({} values)",
                    g.opening_index,
                    self.state_dim()
                )));
            }
        }
        for o in &s.objects {
            field(&o.position_field, 3)?;
            if let Some(q) = &o.quaternion_field {
                field(q, 4)?;
            }
        }
        for m in &s.markers {
            field(&m.position_field, 3)?;
        }
        if let Some(p) = &s.tool_path_field {
            field(p, 3)?;
        }
        Ok(())
    }
}

impl Observation {
    /// Checks the observation against `spec`: the state has the spec's length and only finite
    /// values, and each image (if any are sent) names the camera at its position with that
    /// camera's size and exactly `width * height * 3` bytes of `rgb8`.
    pub fn check_against(&self, spec: &RobotSpec) -> Result<(), ObservationError> {
        let fail = |what: String| ObservationError {
            robot: spec.name.clone(),
            what,
        };
        if self.state.len() != spec.state_dim() {
            return Err(fail(format!(
                "state has {} values, the spec says {}",
                self.state.len(),
                spec.state_dim()
            )));
        }
        if let Some(i) = self.state.iter().position(|x| !x.is_finite()) {
            return Err(fail(format!("state value {i} is {}", self.state[i])));
        }
        if !self.reward.is_finite() {
            return Err(fail(format!("reward is {}", self.reward)));
        }
        if self.images.is_empty() {
            return Ok(());
        }
        if self.images.len() != spec.cameras.len() {
            return Err(fail(format!(
                "{} images for {} cameras",
                self.images.len(),
                spec.cameras.len()
            )));
        }
        for (img, cam) in self.images.iter().zip(&spec.cameras) {
            let want = cam.width as usize * cam.height as usize * 3;
            if img.camera != cam.name
                || img.width != cam.width
                || img.height != cam.height
                || img.encoding != "rgb8"
                || img.data.len() != want
            {
                return Err(fail(format!(
                    "image `{}` is {}x{} {} with {} bytes; camera `{}` is {}x{} rgb8 ({want} bytes)",
                    img.camera,
                    img.width,
                    img.height,
                    img.encoding,
                    img.data.len(),
                    cam.name,
                    cam.width,
                    cam.height
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{ActionKind, ActionSpec, CameraSpec, Image, PROTOCOL_VERSION, StateField};

    fn spec() -> RobotSpec {
        RobotSpec {
            v: PROTOCOL_VERSION,
            name: "arm".into(),
            kind: "test".into(),
            control_hz: 20.0,
            lockstep: true,
            state: vec![StateField::new("q", 2, "rad"), StateField::new("p", 3, "m")],
            action: ActionSpec {
                kind: ActionKind::Box,
                names: vec!["a".into(), "b".into()],
                low: vec![-1.0, -1.0],
                high: vec![1.0, 1.0],
            },
            cameras: vec![CameraSpec {
                name: "front".into(),
                width: 2,
                height: 1,
                intrinsics: Some([2.0, 2.0, 0.5, 0.0]),
                mount: Some(crate::msg::CameraMount {
                    parent: "base".into(),
                    translation_m: [0.5, 0.0, 0.3],
                    rotation_xyzw: [0.0, 0.0, 0.0, 1.0],
                }),
            }],
            joints: vec![],
            max_episode_steps: 10,
            scene: None,
        }
    }

    #[test]
    fn a_good_spec_passes_and_each_defect_is_named() {
        spec().validate().unwrap();
        type Breaker = Box<dyn Fn(&mut RobotSpec)>;
        let cases: Vec<(&str, Breaker)> = vec![
            (
                "bounds",
                Box::new(|s| s.action.high.pop().map(|_| ()).unwrap_or(())),
            ),
            ("bounds", Box::new(|s| s.action.low[0] = f32::INFINITY)),
            ("low <= high", Box::new(|s| s.action.low[1] = 2.0)),
            ("twice", Box::new(|s| s.state[1].name = "q".into())),
            ("size 0", Box::new(|s| s.state[0].size = 0)),
            ("control_hz", Box::new(|s| s.control_hz = f64::NAN)),
            ("key expression", Box::new(|s| s.name = "a/b".into())),
            ("1 ..= 8192", Box::new(|s| s.cameras[0].height = 0)),
            (
                "intrinsics",
                Box::new(|s| s.cameras[0].intrinsics = Some([0.0, 2.0, 0.5, 0.0])),
            ),
            (
                "unit quaternion",
                Box::new(|s| {
                    if let Some(m) = &mut s.cameras[0].mount {
                        m.rotation_xyzw = [0.0, 0.0, 0.0, 2.0];
                    }
                }),
            ),
            (
                "`low` bounds",
                Box::new(|s| s.state[0].low = Some(vec![0.0])),
            ),
            (
                "components",
                Box::new(|s| {
                    s.action.names.clear();
                    s.action.low.clear();
                    s.action.high.clear();
                }),
            ),
        ];
        for (want, break_it) in cases {
            let mut s = spec();
            break_it(&mut s);
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(&s.name), "{want}: {e}");
        }
    }

    #[test]
    fn observations_that_disagree_with_the_spec_are_rejected_by_name() {
        let s = spec();
        let mut o = Observation {
            state: vec![0.0; 5],
            ..Default::default()
        };
        o.check_against(&s).unwrap();
        o.state.pop();
        assert!(
            o.check_against(&s)
                .unwrap_err()
                .to_string()
                .contains("4 values, the spec says 5")
        );
        o.state = vec![0.0, f32::NAN, 0.0, 0.0, 0.0];
        assert!(
            o.check_against(&s)
                .unwrap_err()
                .to_string()
                .contains("value 1")
        );
        o.state = vec![0.0; 5];
        o.images = vec![Image {
            camera: "front".into(),
            width: 2,
            height: 0,
            encoding: "rgb8".into(),
            seq: 0,
            age_ns: 0,
            data: vec![],
        }];
        assert!(
            o.check_against(&s)
                .unwrap_err()
                .to_string()
                .contains("camera `front` is 2x1")
        );
        o.images[0].height = 1;
        o.images[0].data = vec![0; 6];
        o.check_against(&s).unwrap();
    }
}
