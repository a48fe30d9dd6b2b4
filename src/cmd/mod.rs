//! One module per command: its arguments and what it prints. The work is in the libraries.

#[cfg(feature = "train")]
pub mod bc;
#[cfg(feature = "bench")]
pub mod bench;
pub mod bundle;
pub mod calibrate;
#[cfg(feature = "dataset")]
pub mod dataset;
#[cfg(feature = "sim")]
pub mod demo;
#[cfg(feature = "train")]
pub mod distill;
pub mod estop;
pub mod hw;
pub mod keys;
pub mod learn;
pub mod policy;
pub mod replay;
#[cfg(feature = "train")]
pub mod reward;
pub mod run;
#[cfg(feature = "sim")]
pub mod sim;
pub mod teleop;
pub mod viz;
