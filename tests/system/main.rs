//! Whole-system tests of reflex. One test binary (every file directly in tests/ would link the
//! whole dependency tree again); each module is one subject.

mod bus;
mod cli;
mod common;
mod gym_bridge;
mod sim_tasks;
