//! One episode's file: opening it, logging each step, its JSON summary at the end.

use crate::scene::SceneModel;
use crate::{RecorderConfig, RecorderStats, Seen};
use reflex_contracts::msg::{RobotSpec, StatusMsg};
use reflex_runtime::outbox::{Frames, Source, Transition};
use reflex_runtime::safety::SafetyEvent;
use std::sync::atomic::Ordering;

pub(crate) struct Episode {
    /// The episode's file (none when the recorder writes no files).
    pub(crate) rec: Option<rerun::RecordingStream>,
    pub(crate) id: u64,
    pub(crate) steps: u32,
    pub(crate) ret: f32,
    pub(crate) success: bool,
    pub(crate) interventions: u32,
    pub(crate) intervention_steps: u32,
    pub(crate) was_teleop: bool,
    pub(crate) lateness: reflex_runtime::hist::Histogram,
    pub(crate) path: Vec<[f32; 3]>,
    /// Steps of this episode that never reached the recorder (gaps in the step index).
    pub(crate) dropped: u64,
    /// Step index expected next.
    pub(crate) next_step: u32,
    /// Files were asked for but recording is suspended (an earlier write failed).
    pub(crate) unrecorded: bool,
}

/// How long the end of an episode waits for its file to reach the disk.
const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) fn open_episode(
    cfg: &RecorderConfig,
    scene: &SceneModel,
    live: &Option<rerun::RecordingStream>,
    id: u64,
    stats: &RecorderStats,
) -> Option<Episode> {
    // Written under a `.partial` name and renamed when every byte is on disk: a recording cut
    // short (a full disk, a crash) keeps the name that says so.
    let file = cfg.dir.join(format!("episode_{id:06}.rrd.partial"));
    let suspended = stats.suspended.load(Ordering::Relaxed);
    let rec = if !cfg.files || suspended {
        Ok(None)
    } else {
        rerun::RecordingStreamBuilder::new("reflex")
            .recording_id(format!("episode-{id}"))
            .save(&file)
            .map(Some)
    };
    let rec = match rec {
        Ok(r) => r,
        Err(e) => {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("cannot record episode {id} to {}: {e}", file.display());
            return None;
        }
    };
    if let Some(r) = &rec {
        let _ = crate::blueprint::blueprint(&cfg.spec).send(
            r,
            rerun::blueprint::BlueprintActivation {
                make_active: true,
                make_default: true,
            },
        );
        scene.log_static(r);
    }
    if let Some(l) = live {
        scene.log_static(l);
    }
    Some(Episode {
        rec,
        id,
        steps: 0,
        ret: 0.0,
        success: false,
        interventions: 0,
        intervention_steps: 0,
        was_teleop: false,
        lateness: reflex_runtime::hist::Histogram::new(),
        path: Vec::new(),
        dropped: 0,
        next_step: 0,
        unrecorded: cfg.files && suspended,
    })
}

pub(crate) fn finish_episode(
    cfg: &RecorderConfig,
    mut ep: Episode,
    stats: &RecorderStats,
    seen: &Seen,
) {
    // Steps offered after the last one recorded and dropped on the way: the lost tail.
    if let Some(last) = seen.last_step(ep.id).filter(|_| cfg.count_gaps) {
        ep.dropped += u64::from((last + 1).saturating_sub(ep.next_step));
    }
    let mut summary = crate::EpisodeFileSummary {
        episode: ep.id,
        steps: ep.steps,
        ret: ep.ret,
        success: ep.success,
        interventions: ep.interventions,
        intervention_steps: ep.intervention_steps,
        lateness_p50_us: ep.lateness.percentile(50.0).as_secs_f64() * 1e6,
        lateness_p99_us: ep.lateness.percentile(99.0).as_secs_f64() * 1e6,
        lateness_max_us: ep.lateness.max().as_secs_f64() * 1e6,
        dropped_steps: ep.dropped,
        complete: None,
        recording: None,
    };
    let done = format!("episode_{:06}.rrd", ep.id);
    if let Some(rec) = ep.rec.take() {
        let partial = cfg.dir.join(format!("{done}.partial"));
        let complete = match rec.flush_with_timeout(FLUSH_TIMEOUT) {
            Ok(()) => {
                drop(rec);
                std::fs::rename(&partial, cfg.dir.join(&done)).map_err(|e| e.to_string())
            }
            Err(e) => {
                // Rerun's file writer stopped at the failed write; a flush queued behind it is
                // never answered and dropping the stream would wait for it: let the stream go
                // (two idle threads) and write no more files this run.
                std::mem::forget(rec);
                stats.suspended.store(true, Ordering::Relaxed);
                Err(e.to_string())
            }
        };
        if let Err(e) = &complete {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            stats.incomplete.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "episode {} is recorded incompletely (kept as {}): {e}; no more episode files this run",
                ep.id,
                partial.display()
            );
        }
        summary.complete = Some(complete.is_ok());
        summary.recording = Some(if complete.is_ok() {
            done
        } else {
            format!("{done}.partial")
        });
    }
    if ep.unrecorded {
        stats.incomplete.fetch_add(1, Ordering::Relaxed);
        summary.complete = Some(false);
        summary.recording = None;
    }
    stats.episodes.fetch_add(1, Ordering::Relaxed);
    if !cfg.files {
        return;
    }
    let p = cfg.dir.join(format!("episode_{:06}.json", ep.id));
    if let Err(e) = reflex_runtime::fsio::atomic_write(
        &p,
        serde_json::to_string_pretty(&summary)
            .expect("json")
            .as_bytes(),
    ) {
        stats.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("writing {}: {e}", p.display());
    }
}

/// Logs one step to `rec` (the episode file or the live viewer).
pub(crate) fn log_step(
    cfg: &RecorderConfig,
    scene: &mut SceneModel,
    rec: &rerun::RecordingStream,
    ep: &Episode,
    t: &Transition,
    dropped: u64,
) {
    rec.set_time_sequence("step", t.step as i64);
    rec.set_duration_secs("time", t.t.as_secs_f64());
    scene.log_step(rec, t, &ep.path);
    log_joints_and_actions(&cfg.spec, rec, t);
    let teleop = t.source == Source::Teleop;
    let scalar = |k: &str, v: f64| {
        let _ = rec.log(k, &rerun::Scalars::single(v));
    };
    scalar("episode/intervention", teleop as u8 as f64);
    scalar("episode/reward", t.reward as f64);
    scalar("episode/success", t.success as u8 as f64);
    if let Some(p) = t.success_score {
        scalar("episode/success_score", p as f64);
    }
    scalar("timing/lateness_us", t.lateness.as_secs_f64() * 1e6);
    scalar("timing/chunk_age_ms", t.chunk_age.as_secs_f64() * 1e3);
    scalar(
        "timing/policy_latency_ms",
        t.policy_latency.as_secs_f64() * 1e3,
    );
    scalar("telemetry/dropped", dropped as f64);
    log_events(rec, ep, t);
}

/// Per joint the measured position (from the `joint_pos` field, named by the spec's joints);
/// per action component the base, residual and executed values.
fn log_joints_and_actions(spec: &RobotSpec, rec: &rerun::RecordingStream, t: &Transition) {
    if let Some(jr) = spec.field("joint_pos") {
        for (k, name) in spec.joints.iter().enumerate() {
            if let Some(v) = t.obs.get(jr.start + k).filter(|_| k < jr.len()) {
                let _ = rec.log(
                    format!("joints/{name}/measured"),
                    &rerun::Scalars::single(*v as f64),
                );
            }
        }
    }
    for (k, name) in spec.action.names.iter().enumerate() {
        let (Some(b), Some(r), Some(a)) = (t.base.get(k), t.residual.get(k), t.action.get(k))
        else {
            break;
        };
        for (what, v) in [("base", b), ("residual", r), ("executed", a)] {
            let _ = rec.log(
                format!("action/{name}/{what}"),
                &rerun::Scalars::single(*v as f64),
            );
        }
    }
}

/// Takeovers, hand-backs, safety events and the episode's end as text events.
fn log_events(rec: &rerun::RecordingStream, ep: &Episode, t: &Transition) {
    let teleop = t.source == Source::Teleop;
    let info = |text: String| {
        let _ = rec.log(
            "events",
            &rerun::TextLog::new(text).with_level(rerun::TextLogLevel::INFO),
        );
    };
    if teleop && !ep.was_teleop {
        info(format!("step {}: a person took over", t.step));
    }
    if !teleop && ep.was_teleop {
        info(format!("step {}: control handed back", t.step));
    }
    if t.safety_flags != 0 {
        let names: Vec<&str> = SafetyEvent::ALL
            .iter()
            .filter(|e| t.safety_flags & **e as u32 != 0)
            .map(|e| e.name())
            .collect();
        let _ = rec.log(
            "events",
            &rerun::TextLog::new(format!("step {}: safety {}", t.step, names.join(", ")))
                .with_level(rerun::TextLogLevel::WARN),
        );
    }
    if t.estop {
        info(format!("step {}: episode ends (emergency stop)", t.step));
    } else if t.terminated || t.truncated || t.label.is_some() {
        let what = if t.success || t.label == Some(true) {
            "success"
        } else if t.truncated {
            "time limit"
        } else {
            "failure"
        };
        info(format!("step {}: episode ends ({what})", t.step));
    }
}

pub(crate) fn account(scene: &SceneModel, ep: &mut Episode, t: &Transition) {
    let teleop = t.source == Source::Teleop;
    ep.interventions += (teleop && !ep.was_teleop) as u32;
    ep.intervention_steps += teleop as u32;
    ep.was_teleop = teleop;
    ep.steps += 1;
    ep.ret += t.reward;
    ep.success |= t.success || t.label == Some(true);
    ep.lateness.record(t.lateness);
    if let Some(p) = scene.tool_position(&t.obs) {
        ep.path.push(p);
    }
}

/// Camera images at their step, each at its path ([`crate::scene::camera_paths`]).
pub(crate) fn log_frames(rec: &rerun::RecordingStream, f: &Frames, paths: &[String]) {
    rec.set_time_sequence("step", f.step as i64);
    rec.set_duration_secs("time", f.t.as_secs_f64());
    for (i, img) in f.images.iter().enumerate() {
        if img.encoding == "rgb8" && img.data.len() == (img.width * img.height * 3) as usize {
            let path = paths
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("camera/{}", img.camera));
            let _ = rec.log(
                path,
                &rerun::Image::from_rgb24(img.data.clone(), [img.width, img.height]),
            );
        }
    }
}

/// The actor's status as `status/...` series, at the time of the last step logged.
pub(crate) fn log_status(rec: &rerun::RecordingStream, m: &StatusMsg) {
    for (name, v) in [
        ("rate_hz", m.figures.rate_hz),
        ("lateness_p99_us", m.figures.lateness_p99_us),
        ("step_p99_us", m.figures.step_p99_us),
        ("missed", m.figures.missed as f64),
        ("outbox_dropped", m.figures.outbox_dropped as f64),
        ("recorder_dropped", m.recorder_dropped as f64),
        ("residual_version", m.figures.residual_version as f64),
    ] {
        let _ = rec.log(format!("status/{name}"), &rerun::Scalars::single(v));
    }
}
