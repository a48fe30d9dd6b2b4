//! One module per command: its arguments and what it prints. The work is in the libraries.

#[cfg(feature = "bench")]
pub mod bench;
pub mod bundle;
pub mod calibrate;
pub mod demo;
pub mod distill;
pub mod hw;
pub mod learn;
pub mod policy;
pub mod run;
pub mod sim;
pub mod tools;
