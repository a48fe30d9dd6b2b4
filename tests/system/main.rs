//! Whole-system tests of reflex. One test binary (every file directly in tests/ would link the
//! whole dependency tree again); each module is one subject.
// The tests count allocations with a global allocator and signal, time and pipe their child
// processes through libc: unsafe is theirs to use, and each call's safety is local.
#![allow(unsafe_code, clippy::undocumented_unsafe_blocks)]
// A system test reads as one scenario from start to end; the length limit is for library code.
#![allow(clippy::too_many_lines)]

mod alloc_count;
mod arm;
mod bundle;
mod bus;
mod calibration;
mod cli;
mod common;
mod control;
#[cfg(target_arch = "x86_64")]
mod cpus;
mod dataset;
mod demo;
mod distill;
mod faults;
mod fleet;
mod guided_rtc;
mod gym_bridge;
mod layers;
mod learn;
mod learner;
mod lerobot_import;
mod pixels;
mod policies;
mod remote;
mod replay;
mod ros2;
mod secure;
mod served_estop;
mod servo_bus;
mod servo_packets;
mod sim_tasks;
mod tiny_vla;
mod vision;
mod vla_two_graphs;

/// Every allocation in this test binary goes through a counter that only counts on threads that
/// asked for it (see `alloc_count`).
#[global_allocator]
static ALLOCATOR: alloc_count::Counting = alloc_count::Counting;
