//! `reflex viz --robot NAME`: watch a robot in Rerun from anywhere on the network.
//!
//! Subscribes to the actor's step trace (`reflex/<robot>/trace`), its status and the episode
//! events, and streams them into a Rerun viewer (spawned or connected) and/or episode files,
//! through the same recorder `reflex run --record` uses. The robot's process is not touched.

use crate::cli::BusArgs;
use anyhow::{Context, bail};
use clap::Args;
use reflex_runtime::bus::Keys;
use reflex_runtime::recorder::Live;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct VizArgs {
    /// The robot's name on the bus.
    #[arg(long)]
    robot: String,
    /// Where the stream goes: spawn (start a viewer), connect or connect=ADDR (a running viewer),
    /// save=DIR (episode files, no viewer).
    #[arg(long, default_value = "spawn")]
    rerun: String,
    /// Stop after this many episodes have ended (default: run until interrupted).
    #[arg(long)]
    episodes: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<f64>,
    /// How long to wait for the actor (or the robot) to answer, s.
    #[arg(long, default_value_t = 15.0)]
    wait_s: f64,
    /// Print a JSON summary at the end.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    bus: BusArgs,
}

fn parse_target(s: &str) -> anyhow::Result<(Live, Option<PathBuf>)> {
    if let Some(d) = s.strip_prefix("save=") {
        if d.is_empty() {
            bail!("--rerun save=DIR: the directory is missing");
        }
        return Ok((Live::Off, Some(PathBuf::from(d))));
    }
    match Live::parse(s) {
        Ok(Live::Off) => {
            bail!(
                "--rerun off: viz needs somewhere to send the stream (spawn, connect[=ADDR], save=DIR)"
            )
        }
        Ok(l) => Ok((l, None)),
        Err(e) => bail!("{e}, save=DIR"),
    }
}

pub fn run(a: VizArgs) -> anyhow::Result<()> {
    let (live, save) = parse_target(&a.rerun)?;
    let live = crate::replay::with_viewer(live);
    let keys = Keys::new(&a.robot).map_err(anyhow::Error::msg)?;
    let session = a.bus.config().open()?;
    let spec = reflex_runtime::viz::fetch_spec(
        &session,
        &keys,
        Duration::from_secs_f64(a.wait_s.max(0.1)),
    )?;
    tracing::info!(
        "watching `{}` ({}, {} Hz)",
        spec.name,
        spec.kind,
        spec.control_hz
    );
    let stamp = crate::demo::chrono_like_stamp();
    let dir = save.map(|d| {
        d.join(format!("viz-{}-{stamp}", spec.name))
            .join("episodes")
    });
    let recorder = Arc::new(
        crate::run_cmd::make_recorder(dir.clone(), live, &spec, false)
            .context("starting the recorder")?,
    );
    let watch = reflex_runtime::viz::watch(&session, &keys, recorder.clone())?;
    let t0 = Instant::now();
    let pb = if a.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new_spinner()
    };
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let st = &watch.stats;
        let ended = st.episodes_ended.load(Relaxed);
        pb.set_message(format!(
            "{}: {} steps, {} episodes ended, {} status, {} events",
            spec.name,
            st.traces.load(Relaxed),
            ended,
            st.statuses.load(Relaxed),
            st.events.load(Relaxed)
        ));
        pb.tick();
        if a.episodes.is_some_and(|n| ended >= n)
            || a.seconds.is_some_and(|s| t0.elapsed().as_secs_f64() >= s)
        {
            break;
        }
    }
    pb.finish_and_clear();
    let st = watch.stats.clone();
    drop(watch);
    let rs = match Arc::try_unwrap(recorder) {
        Ok(r) => r.finish(),
        Err(_) => bail!("the recorder is still in use"),
    };
    let out = serde_json::json!({
        "robot": spec.name,
        "steps": st.traces.load(Relaxed),
        "episodes_ended": st.episodes_ended.load(Relaxed),
        "statuses": st.statuses.load(Relaxed),
        "events": st.events.load(Relaxed),
        "undecodable": st.bad.load(Relaxed),
        "recorder_dropped": rs.dropped.load(Relaxed),
        "episode_files": if dir.is_some() { rs.episodes.load(Relaxed) } else { 0 },
        "dir": dir.map(|d| d.display().to_string()),
        "wall_s": t0.elapsed().as_secs_f64(),
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "watched `{}`: {} steps, {} episodes ended{}",
            spec.name,
            out["steps"],
            out["episodes_ended"],
            out["dir"]
                .as_str()
                .map(|d| format!(", files in {d}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}
