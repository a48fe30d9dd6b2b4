//! The simulator's settings (`[sim]` in a run config, `--sim FILE`): kept in reflex-tabletop so a
//! config file reads without the physics engine.

pub use reflex_tabletop::sim_config::*;
