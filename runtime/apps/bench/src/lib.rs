//! reflex-bench: what `reflex bench ...` and `reflex soak` measure, and the workloads they
//! measure with. Each bench returns its figures as JSON whose keys name the figure and its unit.
//!
//! Not part of the robot's binary unless asked for: the `reflex` binary's `bench` feature (on by
//! default for a development build, off in `make bundle`) brings this crate in.
//!
//! - [`loop_bench`], [`bus_bench`], [`servo_bench`], [`learner_bench`]: the control loop, the
//!   bus round trip, a servo bus, the SAC learner (beside Pendulum);
//! - [`pixels_bench`]: each stage of learning from pixels (rendering, the frozen encoder, the
//!   actor's image heads, a learner update);
//! - [`kernel_bench`]: the learner's matrix kernel against the `gemm` crate, product by product;
//! - [`rtc_bench`]: a chunking policy whose chunks arrive late, per execution mode and delay;
//! - [`vla_bench`], [`vla_graphs`]: a SmolVLA-shaped flow VLA's cost as two graphs and as one, and
//!   the loop at 30 Hz with it on its thread;
//! - [`fleet_bench`]: one learner's ingest and training rates with 1, 2, 4, 8 actors;
//! - [`soak`]: the actor and its learner for a long run with faults injected;
//! - [`workloads`]: a robot and a policy that do no work (what is measured is the runtime);
//! - [`pendulum`], [`pendulum_run`]: Gymnasium's Pendulum-v1 in Rust and its SAC runs.

pub mod bus_bench;
pub mod fleet_bench;
#[allow(unsafe_code)] // calls the kernel's unsafe product with its checked preconditions
pub mod kernel_bench;
pub mod learner_bench;
pub mod loop_bench;
pub mod pendulum;
pub mod pendulum_run;
pub mod pixels_bench;
pub mod rtc_bench;
pub mod scratch;
pub mod servo_bench;
pub mod soak;
pub mod vla_bench;
pub mod vla_graphs;
pub mod workloads;
