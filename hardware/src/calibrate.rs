//! Guided joint calibration, LeRobot's procedure, so the file it writes is the one LeRobot would:
//! 1. torque off, homing offsets cleared, limits opened to the whole turn;
//! 2. the person puts every joint in the middle of its range: each motor gets the homing offset
//!    that makes that pose read 2047 (a half turn), so no joint's range crosses the point where
//!    the position wraps;
//! 3. the person sweeps every joint except the full-turn ones through its whole range: the
//!    lowest and highest positions seen are its range; full-turn joints (the wrist roll) get
//!    0..4095;
//! 4. the limits are written to the servos and the calibration returned for the file.

use crate::arm::{ArmError, ArmKind, RESOLUTION, ServoArm};
use reflex_calibration::{Calibration, MotorCalibration};
use std::time::Duration;

/// Motors that turn all the way round: their range is the whole turn, not swept.
pub fn full_turn_motors(kind: ArmKind) -> &'static [&'static str] {
    match kind {
        ArmKind::So101Follower | ArmKind::So101Leader => &["wrist_roll"],
        ArmKind::KochFollower | ArmKind::KochLeader => &["shoulder_pan", "wrist_roll"],
    }
}

/// A calibration in progress.
pub struct Calibrator {
    arm: ServoArm,
    kind: ArmKind,
    offsets: Vec<i64>,
    now: Vec<i64>,
    min: Vec<i64>,
    max: Vec<i64>,
}

impl Calibrator {
    /// Opens the arm, turns its torque off, clears its homing offsets and opens its limits.
    pub fn open(kind: ArmKind, port: &str) -> Result<Self, ArmError> {
        let mut arm = ServoArm::open(
            kind,
            port,
            &kind.default_calibration(),
            Duration::from_millis(20),
            2,
        )?;
        let n = arm.dof();
        arm.set_torque(false)?;
        arm.write_homing(&vec![0; n])?;
        arm.write_limits(&vec![0; n], &vec![RESOLUTION - 1; n])?;
        Ok(Calibrator {
            arm,
            kind,
            offsets: vec![0; n],
            now: vec![0; n],
            min: vec![i64::MAX; n],
            max: vec![i64::MIN; n],
        })
    }

    /// Step 2: the arm is in the middle of its range; writes the half-turn homing offsets and
    /// returns them.
    pub fn set_middle(&mut self) -> Result<&[i64], ArmError> {
        self.arm.read_steps(&mut self.now)?;
        for (o, p) in self.offsets.iter_mut().zip(&self.now) {
            *o = self.arm.half_turn_offset(*p);
        }
        self.arm.write_homing(&self.offsets)?;
        Ok(&self.offsets)
    }

    /// Step 3, called repeatedly while the person sweeps: reads every joint and widens the
    /// ranges; returns the positions (steps, after homing).
    pub fn sample(&mut self) -> Result<&[i64], ArmError> {
        self.arm.read_steps(&mut self.now)?;
        for k in 0..self.now.len() {
            self.min[k] = self.min[k].min(self.now[k]);
            self.max[k] = self.max[k].max(self.now[k]);
        }
        Ok(&self.now)
    }

    /// The ranges seen so far: (name, min, max, full turn).
    pub fn ranges(&self) -> Vec<(&'static str, i64, i64, bool)> {
        let full = full_turn_motors(self.kind);
        self.kind
            .motors()
            .iter()
            .enumerate()
            .map(|(k, m)| (m.name, self.min[k], self.max[k], full.contains(&m.name)))
            .collect()
    }

    /// Step 4: checks every swept joint moved, writes the limits, returns the calibration.
    pub fn finish(mut self) -> Result<Calibration, ArmError> {
        let full = full_turn_motors(self.kind);
        let motors = self.kind.motors();
        let (mut lo, mut hi) = (self.min.clone(), self.max.clone());
        for (k, m) in motors.iter().enumerate() {
            if full.contains(&m.name) {
                (lo[k], hi[k]) = (0, RESOLUTION - 1);
            } else if hi[k] - lo[k] < 10 {
                return Err(ArmError::Calibration {
                    arm: self.kind.name(),
                    message: format!(
                        "motor `{}` moved {} steps during the sweep: move every joint through its whole range before pressing enter",
                        m.name,
                        (hi[k] - lo[k]).max(0)
                    ),
                });
            }
        }
        self.arm.write_limits(&lo, &hi)?;
        let ids = self.arm.ids().to_vec();
        Ok(Calibration {
            motors: motors
                .iter()
                .enumerate()
                .map(|(k, m)| {
                    (
                        m.name.to_string(),
                        MotorCalibration {
                            id: ids[k] as i64,
                            drive_mode: 0,
                            homing_offset: self.offsets[k],
                            range_min: lo[k],
                            range_max: hi[k],
                        },
                    )
                })
                .collect(),
        })
    }
}
