//! One module per command: its arguments and what it prints. The work is in the libraries.

pub mod bc;
#[cfg(feature = "bench")]
pub mod bench;
pub mod bundle;
pub mod calibrate;
pub mod dataset;
pub mod demo;
pub mod distill;
pub mod estop;
pub mod hw;
pub mod keys;
pub mod learn;
pub mod policy;
pub mod replay;
pub mod reward;
pub mod run;
pub mod sim;
pub mod teleop;
pub mod viz;
