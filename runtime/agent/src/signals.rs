//! SIGINT and SIGTERM as a person at a robot means them: the first asks the command to finish
//! the work in hand (the emulator removes its link; `reflex run` ends its episode), the second
//! stops at the next control tick (the robot still left as `[robot] on_exit` says), the third
//! quits the process at once, leaving the robot as it is.
//!
//! The signals are taken by a thread of signal-hook's (`iterator`), so nothing here runs inside
//! a signal handler.

use crate::stop::StopHandle;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::OnceLock;

static HANDLE: OnceLock<StopHandle> = OnceLock::new();
static LISTENING: OnceLock<Result<(), String>> = OnceLock::new();

/// Starts listening for SIGINT and SIGTERM (once per process) and returns the process's stop
/// handle: the first signal asks it to finish, the second to stop now. When the signals cannot
/// be taken, the handle is still returned (never asked) and a warning says so: the default
/// action (the process ends) stays in force.
pub fn stop_on_signals() -> StopHandle {
    let handle = HANDLE.get_or_init(StopHandle::new).clone();
    let asked = handle.clone();
    let started = LISTENING.get_or_init(move || {
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
            .map_err(|e| e.to_string())?;
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for (n, sig) in signals.forever().enumerate() {
                    let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                    match n {
                        0 => {
                            asked.finish();
                            tracing::warn!(
                                "{name}: stopping when the work in hand is done (signal again to stop now)"
                            );
                        }
                        1 => {
                            asked.stop_now();
                            tracing::warn!(
                                "{name}: stopping now (signal again to quit at once, leaving the robot as it is)"
                            );
                        }
                        _ => {
                            tracing::error!("{name}: quitting at once");
                            std::process::exit(130);
                        }
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    if let Err(e) = started {
        tracing::warn!("cannot take SIGINT/SIGTERM ({e}): a signal ends the process at once");
    }
    handle
}
