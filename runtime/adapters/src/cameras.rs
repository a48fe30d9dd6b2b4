//! `[robot.cameras]`: a robot's cameras under the names a policy, an image encoder or a success
//! classifier reads.
//!
//! A policy trained on cameras named `front` and `wrist` could not run on a robot whose cameras
//! are `pixels.front` and `pixels.wrist` (gym-hil through the Gymnasium bridge names them by their
//! path in the observation): nothing could rename them. [`CamerasRenamed`] renames them between
//! the robot and everything downstream of it (policy, encoder, classifier, recorder, trace, the
//! learner's features), in the spec and in every observation, and refuses at start a mapping that
//! names a camera the robot lacks, so a typo is an error naming it, never a camera silently left
//! unread.

use reflex_contracts::msg::{Observation, RobotSpec};
use reflex_contracts::robot::{Robot, RobotError};
use reflex_contracts::stop::StopSwitch;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A `[robot.cameras]` mapping that cannot work: the message names the camera at fault.
#[derive(Debug, thiserror::Error)]
#[error("[robot.cameras] {0}")]
pub struct CameraMapError(pub String);

type Result<T> = std::result::Result<T, CameraMapError>;

/// A robot whose cameras go by other names (`[robot.cameras]`: robot name -> new name).
/// Without a mapping it passes everything through untouched.
pub struct CamerasRenamed<R> {
    inner: R,
    spec: RobotSpec,
    /// (robot's name, new name), for the cameras renamed.
    names: Vec<(String, String)>,
    obs: Observation,
}

fn names_of(spec: &RobotSpec) -> String {
    if spec.cameras.is_empty() {
        return "none".into();
    }
    spec.cameras
        .iter()
        .map(|c| format!("`{}`", c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

impl<R: Robot> CamerasRenamed<R> {
    /// `inner` with its cameras renamed by `map` (robot camera name -> the name readers use).
    ///
    /// # Errors
    /// A camera in `map` the robot does not have, two cameras given one name, or a new name that
    /// is the name of another camera of the robot left as it is.
    pub fn new(inner: R, map: &BTreeMap<String, String>) -> Result<Self> {
        let mut spec = inner.spec().clone();
        let bad = CameraMapError;
        for (from, to) in map {
            if !spec.cameras.iter().any(|c| &c.name == from) {
                return Err(bad(format!(
                    "maps camera `{from}` (to `{to}`), which robot `{}` does not have; its cameras: {}",
                    spec.name,
                    names_of(&spec)
                )));
            }
        }
        for c in &mut spec.cameras {
            if let Some(to) = map.get(&c.name) {
                c.name.clone_from(to);
            }
        }
        let robot = &inner.spec().cameras;
        for (i, c) in spec.cameras.iter().enumerate() {
            if let Some(j) = spec.cameras[..i].iter().position(|o| o.name == c.name) {
                return Err(bad(format!(
                    "robot `{}`'s cameras `{}` and `{}` would both be called `{}`: give each its own name",
                    spec.name, robot[j].name, robot[i].name, c.name
                )));
            }
        }
        Ok(CamerasRenamed {
            inner,
            spec,
            names: map.iter().map(|(f, t)| (f.clone(), t.clone())).collect(),
            obs: Observation::default(),
        })
    }

    /// The robot inside.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Copies `src` into the kept observation under the new names, reusing its buffers: once
    /// they have grown to the observation's size this allocates nothing (the loop's thread calls
    /// it every step).
    fn rename(names: &[(String, String)], obs: &mut Observation, src: &Observation) {
        // The robot's own names back first, so a camera's frame counter still lets `copy_from`
        // skip pixels it holds already.
        for img in &mut obs.images {
            if let Some((from, _)) = names.iter().find(|(_, to)| *to == img.camera) {
                img.camera.clone_from(from);
            }
        }
        obs.copy_from(src);
        for img in &mut obs.images {
            if let Some((_, to)) = names.iter().find(|(from, _)| *from == img.camera) {
                img.camera.clone_from(to);
            }
        }
    }
}

impl<R: Robot> Robot for CamerasRenamed<R> {
    fn spec(&self) -> &RobotSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>) -> std::result::Result<&Observation, RobotError> {
        if self.names.is_empty() {
            return self.inner.reset(seed);
        }
        let o = self.inner.reset(seed)?;
        Self::rename(&self.names, &mut self.obs, o);
        Ok(&self.obs)
    }

    fn command(&mut self, action: &[f32]) -> std::result::Result<(), RobotError> {
        self.inner.command(action)
    }

    fn observe(&mut self) -> std::result::Result<&Observation, RobotError> {
        if self.names.is_empty() {
            return self.inner.observe();
        }
        let o = self.inner.observe()?;
        Self::rename(&self.names, &mut self.obs, o);
        Ok(&self.obs)
    }

    fn hold_action(&self, out: &mut [f32]) {
        self.inner.hold_action(out)
    }

    fn attach_stop(&mut self, stop: Arc<StopSwitch>) {
        self.inner.attach_stop(stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflex_contracts::msg::{ActionKind, CameraSpec, Image, PROTOCOL_VERSION};

    /// A robot with two cameras named as the Gymnasium bridge names gym-hil's.
    struct Pixels {
        spec: RobotSpec,
        obs: Observation,
    }

    fn pixels() -> Pixels {
        let mut spec = RobotSpec::new("gymhil", "gym/test", 10.0)
            .with_state("agent_pos", 2, "")
            .with_action(ActionKind::Box, &["a0", "a1"], -1.0, 1.0);
        let mut images = vec![];
        for name in ["pixels.front", "pixels.wrist"] {
            spec.cameras.push(CameraSpec {
                name: name.into(),
                width: 2,
                height: 1,
                intrinsics: None,
                mount: None,
            });
            images.push(Image {
                camera: name.into(),
                width: 2,
                height: 1,
                encoding: "rgb8".into(),
                data: vec![7; 6],
                seq: 0,
                age_ns: 0,
            });
        }
        let obs = Observation {
            v: PROTOCOL_VERSION,
            state: vec![0.0; 2],
            images,
            ..Default::default()
        };
        Pixels { spec, obs }
    }

    impl Robot for Pixels {
        fn spec(&self) -> &RobotSpec {
            &self.spec
        }
        fn reset(&mut self, _: Option<u64>) -> std::result::Result<&Observation, RobotError> {
            Ok(&self.obs)
        }
        fn command(&mut self, _: &[f32]) -> std::result::Result<(), RobotError> {
            self.obs.step += 1;
            self.obs.images[0].data[0] = self.obs.step as u8;
            Ok(())
        }
        fn observe(&mut self) -> std::result::Result<&Observation, RobotError> {
            Ok(&self.obs)
        }
        fn hold_action(&self, out: &mut [f32]) {
            out.fill(0.0);
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn mapped_cameras_reach_readers_under_their_new_names_in_spec_and_observations() {
        let m = map(&[("pixels.front", "front"), ("pixels.wrist", "wrist")]);
        let mut r = CamerasRenamed::new(pixels(), &m).unwrap();
        let names: Vec<&str> = r.spec().cameras.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["front", "wrist"]);
        let o = r.reset(Some(1)).unwrap();
        let names: Vec<&str> = o.images.iter().map(|i| i.camera.as_str()).collect();
        assert_eq!(names, ["front", "wrist"]);
        for step in 1..4u8 {
            let o = r.step(&[0.0, 0.0]).unwrap();
            assert_eq!(
                (o.images[0].camera.as_str(), o.images[0].data[0]),
                ("front", step)
            );
        }
        // The robot itself keeps its names.
        assert_eq!(r.inner().obs.images[1].camera, "pixels.wrist");
    }

    #[test]
    fn a_mapping_of_a_camera_the_robot_lacks_is_refused_naming_it_and_the_robots_cameras() {
        let m = map(&[("pixels.fornt", "front")]);
        let e = CamerasRenamed::new(pixels(), &m).err().unwrap().to_string();
        assert!(
            e.contains("[robot.cameras]")
                && e.contains("`pixels.fornt`")
                && e.contains("`pixels.front`, `pixels.wrist`"),
            "{e}"
        );
    }

    #[test]
    fn two_cameras_under_one_name_are_refused() {
        let m = map(&[("pixels.front", "front"), ("pixels.wrist", "front")]);
        let e = CamerasRenamed::new(pixels(), &m).err().unwrap().to_string();
        assert!(e.contains("would both be called `front`"), "{e}");
        // A new name that is another camera's own name, left as it is.
        let m = map(&[("pixels.front", "pixels.wrist")]);
        let e = CamerasRenamed::new(pixels(), &m).err().unwrap().to_string();
        assert!(e.contains("would both be called `pixels.wrist`"), "{e}");
    }

    #[test]
    fn without_a_mapping_observations_pass_through_untouched() {
        let mut r = CamerasRenamed::new(pixels(), &BTreeMap::new()).unwrap();
        let o: *const Observation = r.reset(None).unwrap();
        assert!(
            std::ptr::eq(o, &r.inner().obs),
            "the robot's own observation, not a copy"
        );
    }
}
