//! reflex-tools: the commands around a run, as a library: serving the simulator or a real arm
//! on the bus, watching a robot and replaying its recordings, driving it by hand, its e-stop
//! from any computer, and checking, timing and training base policies.
//!
//! - `simtools`: `reflex sim serve|bench|demos|expert|snapshot`;
//! - [`serve`]: `reflex hw serve` (a real arm on the bus);
//! - [`teleop`]: a teleop device's commands onto the bus, and what the robot answers;
//! - [`operator`]: `reflex estop` (raise, release, resume);
//! - [`viz`], [`replay`]: `reflex viz` and `reflex replay`;
//! - [`policytools`]: `reflex policy check|bench`;
//! - `bctrain`, `rewardtrain`: `reflex bc train` and `reflex reward train`;
//! - `distill`: `reflex distill` (a refined policy made into the next base);
//! - `policy_infer`: `reflex policy infer` (a model on observations from a file);
//! - [`calibrate`]: `reflex calibrate camera|hand-eye`; `boardviews`: `reflex sim board-views`.
//!
//! Features: `sim` (simtools, boardviews), `train` (bctrain, rewardtrain, distill) and `import`
//! (policy_infer) are a workstation's; the robot's binary is built without them.
//!
//! Long jobs report through [`reflex_agent::progress::Progress`]; nothing here prints.

#[cfg(feature = "train")]
pub mod bctrain;
#[cfg(feature = "sim")]
pub mod boardviews;
pub mod calibrate;
#[cfg(feature = "train")]
pub mod distill;
pub mod operator;
#[cfg(feature = "import")]
pub mod policy_infer;
pub mod policytools;
pub mod replay;
#[cfg(feature = "train")]
pub mod rewardtrain;
pub mod serve;
#[cfg(feature = "sim")]
pub mod simtools;
pub mod teleop;
pub mod viz;
