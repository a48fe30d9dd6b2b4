//! The arms: SO-101 and Koch profiles (follower and leader) and [`ServoArm`], which reads and
//! commands an arm's joints through its bus in joint units, through a LeRobot calibration.
//!
//! Units: the body joints in radians, zero at the middle of the calibrated range (the pose the
//! calibration asks for, which is the zero of the SO-101's `so101_new_calib` description), the
//! sign given by the calibration's drive mode; the gripper as a fraction of its calibrated range,
//! 0 (range_min) to 1 (range_max). Conversions clamp goals into the calibrated range, so no goal
//! outside what the joint was calibrated to reach ever goes on the wire.
//!
//! Every tick is one SYNC READ of the present positions and one SYNC WRITE of the goals, each
//! timed into a fixed histogram (no allocation per tick) and counted.

use crate::bus::{BusError, BusStats, Dynamixel, Feetech, Register, ServoBus};
use crate::dynamixel::x_series;
use crate::feetech::{self, sts3215};
use reflex_calibration::{Calibration, DeviceKind, MotorCalibration};
use reflex_runtime::hist::Histogram;
use std::time::{Duration, Instant};

/// The STS3215's model number (what PING's follow-up read of address 3 returns).
pub const STS3215_MODEL: u16 = 777;
/// The XL330-M288's model number (in its PING answer).
pub const XL330_M288_MODEL: u16 = 1200;

/// Which servos the bus holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServoModel {
    /// Feetech STS3215 (SO-100/SO-101), Feetech protocol 0.
    Sts3215,
    /// Dynamixel XL330-M288 (Koch), Protocol 2.0.
    Xl330,
}

/// Steps per turn of the STS3215 and the X series.
pub const RESOLUTION: i64 = 4096;

/// An arm reflex knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmKind {
    /// SO-100/SO-101 follower: six Feetech STS3215, ids 1-6.
    So101Follower,
    /// SO-100/SO-101 leader: six Feetech STS3215 (geared 1/345, 1/191, 1/147), ids 1-6.
    So101Leader,
    /// Koch v1.1 follower: Dynamixel XL430-W250 (ids 1-2) and XL330-M288 (3-6).
    KochFollower,
    /// Koch v1.1 leader: Dynamixel XL330-M077 (1-5) and XL330-M288 (6).
    KochLeader,
}

/// One motor of an arm.
#[derive(Clone, Copy, Debug)]
pub struct Motor {
    /// LeRobot's name (the key in the calibration file).
    pub name: &'static str,
    /// Default id on the bus.
    pub id: u8,
    /// Servo model.
    pub servo: &'static str,
}

const fn m(name: &'static str, id: u8, servo: &'static str) -> Motor {
    Motor { name, id, servo }
}

const SO101: [Motor; 6] = [
    m("shoulder_pan", 1, "sts3215"),
    m("shoulder_lift", 2, "sts3215"),
    m("elbow_flex", 3, "sts3215"),
    m("wrist_flex", 4, "sts3215"),
    m("wrist_roll", 5, "sts3215"),
    m("gripper", 6, "sts3215"),
];
const KOCH_FOLLOWER: [Motor; 6] = [
    m("shoulder_pan", 1, "xl430-w250"),
    m("shoulder_lift", 2, "xl430-w250"),
    m("elbow_flex", 3, "xl330-m288"),
    m("wrist_flex", 4, "xl330-m288"),
    m("wrist_roll", 5, "xl330-m288"),
    m("gripper", 6, "xl330-m288"),
];
const KOCH_LEADER: [Motor; 6] = [
    m("shoulder_pan", 1, "xl330-m077"),
    m("shoulder_lift", 2, "xl330-m077"),
    m("elbow_flex", 3, "xl330-m077"),
    m("wrist_flex", 4, "xl330-m077"),
    m("wrist_roll", 5, "xl330-m077"),
    m("gripper", 6, "xl330-m288"),
];

impl ArmKind {
    /// Every arm, for listings and errors.
    pub const ALL: [ArmKind; 4] = [
        ArmKind::So101Follower,
        ArmKind::So101Leader,
        ArmKind::KochFollower,
        ArmKind::KochLeader,
    ];

    /// The name used on the command line and in configs: `so101-follower`, ...
    pub fn name(self) -> &'static str {
        match self {
            ArmKind::So101Follower => "so101-follower",
            ArmKind::So101Leader => "so101-leader",
            ArmKind::KochFollower => "koch-follower",
            ArmKind::KochLeader => "koch-leader",
        }
    }

    /// The arm called `name` (see [`ArmKind::name`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Its motors, in LeRobot's order (the calibration file's order).
    pub fn motors(self) -> &'static [Motor] {
        match self {
            ArmKind::So101Follower | ArmKind::So101Leader => &SO101,
            ArmKind::KochFollower => &KOCH_FOLLOWER,
            ArmKind::KochLeader => &KOCH_LEADER,
        }
    }

    /// The servos' protocol family (what the emulator serves).
    pub fn servo_model(self) -> ServoModel {
        match self {
            ArmKind::So101Follower | ArmKind::So101Leader => ServoModel::Sts3215,
            ArmKind::KochFollower | ArmKind::KochLeader => ServoModel::Xl330,
        }
    }

    /// A leader arm (moved by hand, torque off) rather than a follower.
    pub fn is_leader(self) -> bool {
        matches!(self, ArmKind::So101Leader | ArmKind::KochLeader)
    }

    /// Where LeRobot keeps this arm's calibration: (robots or teleoperators, device type).
    pub fn calibration_type(self) -> (DeviceKind, &'static str) {
        match self {
            ArmKind::So101Follower => (DeviceKind::Robot, "so101_follower"),
            ArmKind::So101Leader => (DeviceKind::Teleoperator, "so101_leader"),
            ArmKind::KochFollower => (DeviceKind::Robot, "koch_follower"),
            ArmKind::KochLeader => (DeviceKind::Teleoperator, "koch_leader"),
        }
    }

    /// What an uncalibrated arm is taken to be: every joint's range the full turn, zero at its
    /// middle (step 2047.5), no inversion, homing offset 0. Right for the emulated servos; a
    /// real arm needs its own calibration.
    pub fn default_calibration(self) -> Calibration {
        Calibration {
            motors: self
                .motors()
                .iter()
                .map(|mo| {
                    (
                        mo.name.to_string(),
                        MotorCalibration {
                            id: mo.id as i64,
                            drive_mode: 0,
                            homing_offset: 0,
                            range_min: 0,
                            range_max: RESOLUTION - 1,
                        },
                    )
                })
                .collect(),
        }
    }
}

/// How one joint's steps map to its unit.
#[derive(Clone, Copy, Debug)]
struct JointMap {
    min: i64,
    max: i64,
    sign: f64,
    /// Body joints: radians around the range's middle; the gripper: fraction of its range.
    fraction: bool,
}

impl JointMap {
    fn new(c: &MotorCalibration, fraction: bool) -> Self {
        JointMap {
            min: c.range_min,
            max: c.range_max,
            sign: if c.drive_mode == 1 { -1.0 } else { 1.0 },
            fraction,
        }
    }

    fn mid(&self) -> f64 {
        (self.min + self.max) as f64 / 2.0
    }

    fn unit_of(self, steps: i64) -> f64 {
        if self.fraction {
            let f = (steps - self.min) as f64 / (self.max - self.min).max(1) as f64;
            if self.sign < 0.0 { 1.0 - f } else { f }
        } else {
            self.sign * (steps as f64 - self.mid()) * std::f64::consts::TAU / RESOLUTION as f64
        }
    }

    fn steps_of(self, unit: f64) -> i64 {
        let s = if self.fraction {
            let f = if self.sign < 0.0 { 1.0 - unit } else { unit };
            self.min as f64 + f * (self.max - self.min) as f64
        } else {
            self.mid() + self.sign * unit * RESOLUTION as f64 / std::f64::consts::TAU
        };
        (s.round() as i64).clamp(self.min, self.max)
    }

    /// The unit range the calibration allows: (low, high).
    fn unit_range(&self) -> (f64, f64) {
        let (a, b) = (self.unit_of(self.min), self.unit_of(self.max));
        (a.min(b), a.max(b))
    }
}

enum AnyBus {
    Feetech(ServoBus<Feetech>),
    Dynamixel(ServoBus<Dynamixel>),
}

macro_rules! on_bus {
    ($bus:expr, $b:ident => $e:expr) => {
        match $bus {
            AnyBus::Feetech($b) => $e,
            AnyBus::Dynamixel($b) => $e,
        }
    };
}

/// A goal in steps as the register holds it: Feetech's sign-magnitude, Dynamixel's two's
/// complement. Goals are inside the calibrated range (0..4096), so Feetech's sign bit is unused.
fn encode(feetech: bool, steps: i64) -> u32 {
    if feetech {
        feetech::to_sign_magnitude(steps as i32, 15).unwrap_or(0)
    } else {
        steps as i32 as u32
    }
}

/// Bus timing of an arm: every sync read and sync write timed, reads that failed after every
/// retry counted.
#[derive(Clone, Debug, Default)]
pub struct ArmTiming {
    /// SYNC READ of the present positions, send to last answer.
    pub read: Histogram,
    /// SYNC WRITE of the goals.
    pub write: Histogram,
    /// Ticks whose read failed after every retry.
    pub missed_reads: u64,
    /// Writes that failed.
    pub failed_writes: u64,
}

/// An arm on its bus, in joint units through its calibration.
pub struct ServoArm {
    kind: ArmKind,
    bus: AnyBus,
    ids: Vec<u8>,
    maps: Vec<JointMap>,
    raw: Vec<u32>,
    goal: Vec<u32>,
    timing: ArmTiming,
}

impl ServoArm {
    /// Opens the arm `kind` on `port` (1 Mbaud) with `calibration` (its motors by LeRobot's
    /// names; ids from the file), checks every motor answers a PING.
    pub fn open(
        kind: ArmKind,
        port: &str,
        calibration: &Calibration,
        timeout: Duration,
        retries: u32,
    ) -> Result<Self, ArmError> {
        let motors = kind.motors();
        let mut ids = Vec::with_capacity(motors.len());
        let mut maps = Vec::with_capacity(motors.len());
        for (k, mo) in motors.iter().enumerate() {
            let c = calibration
                .motor(mo.name)
                .ok_or_else(|| ArmError::Calibration {
                    arm: kind.name(),
                    message: format!(
                        "no motor `{}` in the calibration (it has {}); calibrate this arm with `reflex calibrate joints --robot {}`",
                        mo.name,
                        calibration
                            .motors
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        kind.name()
                    ),
                })?;
            let id = u8::try_from(c.id).map_err(|_| ArmError::Calibration {
                arm: kind.name(),
                message: format!("motor `{}` has id {}, not a bus id", mo.name, c.id),
            })?;
            ids.push(id);
            maps.push(JointMap::new(c, k == motors.len() - 1));
        }
        let bus = match kind.servo_model() {
            ServoModel::Sts3215 => {
                let mut b = ServoBus::<Feetech>::open(port, 1_000_000)?;
                b.timeout = timeout;
                b.retries = retries;
                AnyBus::Feetech(b)
            }
            ServoModel::Xl330 => {
                let mut b = ServoBus::<Dynamixel>::open(port, 1_000_000)?;
                b.timeout = timeout;
                b.retries = retries;
                AnyBus::Dynamixel(b)
            }
        };
        let n = ids.len();
        let mut arm = ServoArm {
            kind,
            bus,
            ids,
            maps,
            raw: vec![0; n],
            goal: vec![0; n],
            timing: ArmTiming::default(),
        };
        for (k, mo) in motors.iter().enumerate() {
            let id = arm.ids[k];
            on_bus!(&mut arm.bus, b => b.ping(id)).map_err(|e| ArmError::Missing {
                arm: kind.name(),
                motor: mo.name,
                id,
                source: e,
            })?;
        }
        Ok(arm)
    }

    /// The arm.
    pub fn kind(&self) -> ArmKind {
        self.kind
    }

    /// Joints (motors), in order.
    pub fn dof(&self) -> usize {
        self.ids.len()
    }

    /// The range each joint's calibration allows, in joint units.
    pub fn ranges(&self) -> Vec<(f64, f64)> {
        self.maps.iter().map(|m| m.unit_range()).collect()
    }

    fn regs(&self) -> (Register, Register, Register) {
        match self.bus {
            AnyBus::Feetech(_) => (
                sts3215::PRESENT_POSITION,
                sts3215::GOAL_POSITION,
                sts3215::TORQUE_ENABLE,
            ),
            AnyBus::Dynamixel(_) => (
                x_series::PRESENT_POSITION,
                x_series::GOAL_POSITION,
                x_series::TORQUE_ENABLE,
            ),
        }
    }

    fn decode(&self, raw: u32) -> i64 {
        match self.bus {
            AnyBus::Feetech(_) => feetech::from_sign_magnitude(raw, 15) as i64,
            AnyBus::Dynamixel(_) => raw as i32 as i64,
        }
    }

    /// Takes hold of the arm where it is: reads every joint, makes that its goal, then turns the
    /// torque on, so nothing moves when the servos start holding. Returns the pose (joint units).
    pub fn hold_here(&mut self, out: &mut [f64]) -> Result<(), ArmError> {
        self.read(out)?;
        let here = out.to_vec();
        self.write(&here)?;
        self.set_torque(true)
    }

    /// Turns every motor's torque on or off.
    pub fn set_torque(&mut self, on: bool) -> Result<(), ArmError> {
        let (_, _, torque) = self.regs();
        for k in 0..self.ids.len() {
            let id = self.ids[k];
            on_bus!(&mut self.bus, b => b.write(id, torque, on as u32, "Torque_Enable"))?;
        }
        Ok(())
    }

    /// Reads every joint's present position into `out` (joint units) with one SYNC READ.
    pub fn read(&mut self, out: &mut [f64]) -> Result<(), ArmError> {
        let (present, _, _) = self.regs();
        let t = Instant::now();
        let r = on_bus!(&mut self.bus, b => b.sync_read(present, "Present_Position", &self.ids, &mut self.raw));
        if let Err(e) = r {
            self.timing.missed_reads += 1;
            return Err(e.into());
        }
        self.timing.read.record(t.elapsed());
        for ((o, m), r) in out.iter_mut().zip(&self.maps).zip(&self.raw) {
            *o = m.unit_of(self.decode(*r));
        }
        Ok(())
    }

    /// Sends every joint's goal (joint units, clamped into the calibrated range) with one SYNC
    /// WRITE.
    pub fn write(&mut self, goal: &[f64]) -> Result<(), ArmError> {
        let feetech = matches!(self.bus, AnyBus::Feetech(_));
        for ((g, m), u) in self.goal.iter_mut().zip(&self.maps).zip(goal) {
            *g = encode(feetech, m.steps_of(*u));
        }
        let (_, reg, _) = self.regs();
        let t = Instant::now();
        let r = on_bus!(&mut self.bus, b => b.sync_write(reg, &self.ids, &self.goal));
        if let Err(e) = r {
            self.timing.failed_writes += 1;
            return Err(e.into());
        }
        self.timing.write.record(t.elapsed());
        Ok(())
    }

    /// Every motor's present position in steps, as the servo reports it (no calibration).
    pub fn read_steps(&mut self, out: &mut [i64]) -> Result<(), ArmError> {
        let (present, _, _) = self.regs();
        on_bus!(&mut self.bus, b => b.sync_read(present, "Present_Position", &self.ids, &mut self.raw))?;
        for (o, r) in out.iter_mut().zip(&self.raw) {
            *o = self.decode(*r);
        }
        Ok(())
    }

    /// Writes `values[k]` to register `reg` of motor `k`, one acknowledged WRITE each.
    fn write_each(&mut self, reg: Register, name: &str, values: &[u32]) -> Result<(), ArmError> {
        for (k, v) in values.iter().enumerate() {
            let id = self.ids[k];
            on_bus!(&mut self.bus, b => b.write(id, reg, *v, name))?;
        }
        Ok(())
    }

    /// The family's (homing offset, min limit, max limit) registers.
    fn calibration_regs(&self) -> (Register, Register, Register) {
        match self.bus {
            AnyBus::Feetech(_) => (
                sts3215::HOMING_OFFSET,
                sts3215::MIN_POSITION_LIMIT,
                sts3215::MAX_POSITION_LIMIT,
            ),
            AnyBus::Dynamixel(_) => (x_series::HOMING_OFFSET, (52, 4), (48, 4)),
        }
    }

    /// Writes homing offsets (steps, signed) to every motor: Feetech's sign-magnitude with the
    /// sign in bit 11 (so at most 2047 either way), Dynamixel's two's complement.
    pub fn write_homing(&mut self, offsets: &[i64]) -> Result<(), ArmError> {
        let feetech = matches!(self.bus, AnyBus::Feetech(_));
        let mut raw = Vec::with_capacity(offsets.len());
        for (k, o) in offsets.iter().enumerate() {
            raw.push(if feetech {
                feetech::to_sign_magnitude(*o as i32, 11).ok_or_else(|| ArmError::Calibration {
                    arm: self.kind.name(),
                    message: format!(
                        "motor `{}`: homing offset {o} does not fit the servo's 11-bit register",
                        self.kind.motors()[k].name
                    ),
                })?
            } else {
                *o as i32 as u32
            });
        }
        let (homing, _, _) = self.calibration_regs();
        self.write_each(homing, "Homing_Offset", &raw)
    }

    /// Writes every motor's position limits (steps).
    pub fn write_limits(&mut self, min: &[i64], max: &[i64]) -> Result<(), ArmError> {
        let (_, lo, hi) = self.calibration_regs();
        let lo_v: Vec<u32> = min.iter().map(|v| *v as u32).collect();
        let hi_v: Vec<u32> = max.iter().map(|v| *v as u32).collect();
        self.write_each(lo, "Min_Position_Limit", &lo_v)?;
        self.write_each(hi, "Max_Position_Limit", &hi_v)
    }

    /// How the family applies a homing offset: the offset that makes `present` (read with no
    /// offset) read as the half turn, 2047. Feetech reports `actual - offset`, Dynamixel
    /// `actual + offset`.
    pub fn half_turn_offset(&self, present: i64) -> i64 {
        let half = RESOLUTION / 2 - 1;
        match self.bus {
            // The Feetech's present position wraps at one turn, so an offset and the same offset
            // plus or minus a turn mean the same; take the one the 11-bit register holds. A
            // middle read at 4095 would need 2048, one more than the register takes: 2047 puts
            // the middle at 2048 instead, one step off (LeRobot #1296 overflows there).
            AnyBus::Feetech(_) => {
                let o = (present - half + RESOLUTION / 2).rem_euclid(RESOLUTION) - RESOLUTION / 2;
                o.clamp(-(RESOLUTION / 2 - 1), RESOLUTION / 2 - 1)
            }
            AnyBus::Dynamixel(_) => half - present,
        }
    }

    /// The ids on the bus, in motor order.
    pub fn ids(&self) -> &[u8] {
        &self.ids
    }

    /// The bus timing so far.
    pub fn timing(&self) -> &ArmTiming {
        &self.timing
    }

    /// The bus's counters (retries, timeouts, corrupt answers, ...).
    pub fn bus_stats(&self) -> BusStats {
        on_bus!(&self.bus, b => b.stats())
    }

    /// The serial port.
    pub fn port(&self) -> &str {
        on_bus!(&self.bus, b => b.port())
    }
}

/// Why an arm cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// The bus failed.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// A motor did not answer when the arm was opened.
    #[error(
        "{arm}: motor `{motor}` (id {id}) does not answer: {source}. Check its cable and power, and that its id is {id} (LeRobot's `lerobot-setup-motors` sets ids)"
    )]
    Missing {
        /// The arm.
        arm: &'static str,
        /// The motor.
        motor: &'static str,
        /// Its id.
        id: u8,
        /// What the bus said.
        source: BusError,
    },
    /// The calibration does not fit the arm.
    #[error("{arm}: {message}")]
    Calibration {
        /// The arm.
        arm: &'static str,
        /// What is wrong.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal(min: i64, max: i64, drive_mode: i64) -> MotorCalibration {
        MotorCalibration {
            id: 1,
            drive_mode,
            homing_offset: 0,
            range_min: min,
            range_max: max,
        }
    }

    #[test]
    fn joint_units_go_round_trip_and_goals_stay_in_the_calibrated_range() {
        let j = JointMap::new(&cal(1000, 3000, 0), false);
        assert_eq!(j.unit_of(2000), 0.0);
        let quarter = std::f64::consts::FRAC_PI_2;
        // A quarter turn is 1024 steps past the middle: beyond the range, so clamped to its end.
        assert_eq!(j.steps_of(quarter), 3000);
        assert_eq!(j.steps_of(quarter / 2.0), 2512);
        assert_eq!(j.steps_of(-0.1), 2000 - 65);
        assert!((j.unit_of(j.steps_of(0.3)) - 0.3).abs() < std::f64::consts::TAU / 4096.0);
        assert_eq!(j.steps_of(10.0), 3000);
        assert_eq!(j.steps_of(-10.0), 1000);
        let inv = JointMap::new(&cal(1000, 3000, 1), false);
        assert_eq!(inv.steps_of(-0.1), 2000 + 65);
        let (lo, hi) = inv.unit_range();
        assert!((lo + hi).abs() < 1e-12 && hi > 1.5);
    }

    #[test]
    fn the_gripper_is_a_fraction_of_its_range() {
        let g = JointMap::new(&cal(2000, 3000, 0), true);
        assert_eq!(g.unit_of(2000), 0.0);
        assert_eq!(g.unit_of(3000), 1.0);
        assert_eq!(g.steps_of(0.25), 2250);
        assert_eq!(g.steps_of(2.0), 3000);
        let inv = JointMap::new(&cal(2000, 3000, 1), true);
        assert_eq!(inv.steps_of(0.25), 2750);
        assert_eq!(inv.unit_of(2750), 0.25);
    }

    #[test]
    fn a_full_turn_joint_is_centred_on_its_middle() {
        let roll = JointMap::new(&cal(0, 4095, 0), false);
        let (lo, hi) = roll.unit_range();
        assert!(
            (lo + std::f64::consts::PI).abs() < 2e-3 && (hi - std::f64::consts::PI).abs() < 2e-3
        );
        assert_eq!(roll.steps_of(0.0), 2048);
    }

    #[test]
    fn every_arm_has_a_name_that_parses_back_and_six_motors() {
        for k in ArmKind::ALL {
            assert_eq!(ArmKind::parse(k.name()), Some(k));
            assert_eq!(k.motors().len(), 6);
            assert_eq!(k.default_calibration().motors.len(), 6);
        }
        assert_eq!(ArmKind::parse("so100"), None);
    }
}
