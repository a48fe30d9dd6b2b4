//! What `reflex bench ...` measures; each returns the figures as JSON (keys name the figure and
//! its unit).

pub mod bus_bench;
pub mod learner_bench;
pub mod loop_bench;
pub mod servo_bench;
