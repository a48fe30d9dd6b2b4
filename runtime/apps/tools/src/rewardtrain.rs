//! What `reflex reward train` runs: a success classifier trained on labelled camera frames
//! (workstation builds).

use crate::bctrain::add_frames;
use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_imitate::BcError;
use reflex_vision::encoder::Frames;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `reflex reward train` asks for.
#[derive(Clone, Debug)]
pub struct RewardTrainOptions {
    /// Where the labelled frames come from.
    pub source: RewardSource,
    /// Cameras the classifier reads.
    pub cameras: Vec<String>,
    /// Size it reads images at, (width, height) (default: the recorded size).
    pub image_size: Option<(u32, u32)>,
    /// Fraction of the episodes (the last ones) held out to judge it.
    pub holdout: f64,
    /// Probability at or above which a frame counts as success.
    pub threshold: f32,
    /// Training settings.
    pub cfg: reflex_vision::reward::RewardTrainConfig,
    /// Output model (its spec is written beside it as `<name>.reward.toml`).
    pub out: PathBuf,
    /// The command that trains it (recorded as its provenance).
    pub command: String,
}

/// Where `reflex reward train` finds labelled frames.
#[derive(Clone, Debug)]
pub enum RewardSource {
    /// A directory written by `reflex sim demos --cameras`: labels from the task's success.
    Demos(PathBuf),
    /// Recorded runs: a run directory (`runs/<id>`, its step log in `steps/`) or a directory of
    /// them (`runs/`), written by `reflex run --record` with cameras. Labels from each step's
    /// reward and each episode's end: the person's success or failure key where one was pressed,
    /// else the robot's (or a classifier's) verdict.
    Runs(PathBuf),
}

impl RewardSource {
    /// The episode directories (each a manifest and its episode files), in order.
    pub fn episode_dirs(&self) -> Result<Vec<PathBuf>> {
        let runs = match self {
            RewardSource::Demos(d) => return Ok(vec![d.clone()]),
            RewardSource::Runs(d) => d,
        };
        let has_log = |d: &Path| d.join("steps").join("manifest.json").is_file();
        if has_log(runs) {
            return Ok(vec![runs.join("steps")]);
        }
        let entries = std::fs::read_dir(runs).map_err(|e| {
            reflex_agent::error::bail(format!(
                "--runs {}: {e}; name one run (runs/<id>) or a directory of runs (runs/)",
                runs.display()
            ))
        })?;
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|d| has_log(d))
            .map(|d| d.join("steps"))
            .collect();
        dirs.sort();
        if dirs.is_empty() {
            return Err(reflex_agent::error::bail(format!(
                "{}: no run with a step log here (a run keeps one in <run>/steps/ when it is \
                 recorded with cameras: `reflex run --record DIR`)",
                runs.display()
            )));
        }
        Ok(dirs)
    }

    /// The directory named on the command line.
    pub fn dir(&self) -> &Path {
        match self {
            RewardSource::Demos(d) | RewardSource::Runs(d) => d,
        }
    }
}

/// Frames and how many of them show success.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct FrameCount {
    /// Episodes.
    pub episodes: usize,
    /// Frames.
    pub frames: usize,
    /// Frames labelled success.
    pub successes: usize,
}

/// What training the classifier produced and how it did on the held-out episodes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RewardTrainReport {
    /// The model written.
    pub model: PathBuf,
    /// Its spec.
    pub spec: PathBuf,
    /// What it trained on.
    pub train: FrameCount,
    /// What it was judged on.
    pub held_out: FrameCount,
    /// The held-out frames' confusion counts at the threshold.
    pub confusion: reflex_vision::reward::Confusion,
    /// Held-out accuracy.
    pub accuracy: f64,
    /// Held-out precision (success calls that were right).
    pub precision: f64,
    /// Held-out recall (success frames found).
    pub recall: f64,
    /// Of the false positives, those at most [`NEAR_FRAMES`] frames before a success frame of
    /// the same episode: the task all but done (a success that ends an episode labels one frame,
    /// and the frames just before it look alike).
    pub false_positives_near_success: u64,
    /// The threshold.
    pub threshold: f32,
    /// Mean loss of the last 100 steps.
    pub final_loss: f32,
    /// Wall time, s.
    pub wall_s: f64,
}

/// How close before a success frame a false positive counts as "near" it.
pub const NEAR_FRAMES: usize = 2;

/// Whether each observation of `ep` shows success: the one after a step that the task rewarded
/// (the simulator's sparse reward is 1 on success), or the last of a successful episode; a
/// person's success or failure key at the end decides the last one.
pub fn success_labels(ep: &reflex_data::demos::Episode) -> Vec<bool> {
    let last = ep.observations.len().saturating_sub(1);
    (0..ep.observations.len())
        .map(|i| match ep.person_label {
            Some(label) if i == last => label,
            _ => {
                (i >= 1 && ep.rewards.get(i - 1).is_some_and(|r| *r >= 1.0))
                    || (i == last && ep.success)
            }
        })
        .collect()
}

/// Trains a success classifier on recorded frames, judges it on held-out episodes, and exports
/// it to ONNX with its spec.
pub fn reward_train(o: &RewardTrainOptions, progress: &dyn Progress) -> Result<RewardTrainReport> {
    let t0 = Instant::now();
    check_reward_options(o)?;
    let LabelledFrames {
        train_f,
        held_f,
        train_y,
        held_y,
        held_near,
        train_eps,
        held_eps,
        n_held,
        commands,
    } = read_labelled(o)?;
    let count = |f: &Option<Frames>, y: &[bool], episodes| FrameCount {
        episodes,
        frames: f.as_ref().map_or(0, |f| f.len()),
        successes: y.iter().filter(|&&l| l).count(),
    };
    let (train_c, held_c) = (
        count(&train_f, &train_y, train_eps),
        count(&held_f, &held_y, held_eps),
    );
    let train_f = train_f.ok_or_else(|| {
        reflex_agent::error::bail(format!(
            "{}: no episodes with frames to train on",
            o.source.dir().display()
        ))
    })?;
    if train_c.successes == 0 || train_c.successes == train_c.frames {
        return Err(reflex_agent::error::bail(format!(
            "{}: the {} training episodes (the last {n_held} are held out) give {} success \
             and {} failure frames; a classifier needs both: record more episodes, with \
             successes and failures, or hold out fewer (--holdout)",
            o.source.dir().display(),
            train_c.episodes,
            train_c.successes,
            train_c.frames - train_c.successes
        )));
    }
    tracing::info!(
        "training a success classifier on {} frames ({} success) of {} episodes, cameras {:?} at {}x{}; {} episodes held out",
        train_c.frames,
        train_c.successes,
        train_c.episodes,
        train_f.cameras,
        train_f.width,
        train_f.height,
        n_held
    );
    progress.start(o.cfg.steps as u64, "steps");
    let mut final_loss = f32::NAN;
    let mut last = 0u64;
    let net = reflex_vision::reward::train(&train_f, &train_y, &o.cfg, |step, loss| {
        progress.inc(step as u64 - last.min(step as u64));
        last = step as u64;
        progress.message(&format!("loss {loss:.4}"));
        final_loss = loss;
    })
    .map_err(BcError::from)?;
    progress.finish();
    let probs = match &held_f {
        Some(h) => probabilities(&net, h)?,
        None => vec![],
    };
    let confusion = reflex_vision::reward::Confusion::of(&probs, &held_y, o.threshold);
    let near = probs
        .iter()
        .zip(&held_near)
        .filter(|(p, n)| **p >= o.threshold && **n)
        .count() as u64;
    let name = o
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "reward".into());
    let mut spec = net.spec(&name, o.threshold);
    spec.provenance = Some(provenance(
        o,
        &commands,
        (&train_c, &held_c),
        &confusion,
        near,
        t0.elapsed().as_secs_f64(),
    ));
    let sp = write_classifier(&o.out, &net, &spec)?;
    Ok(RewardTrainReport {
        model: o.out.clone(),
        spec: sp,
        train: train_c,
        held_out: held_c,
        confusion,
        accuracy: confusion.accuracy(),
        precision: confusion.precision(),
        recall: confusion.recall(),
        false_positives_near_success: near,
        threshold: o.threshold,
        final_loss,
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// The classifier's options that cannot work, refused before anything is read.
fn check_reward_options(o: &RewardTrainOptions) -> Result<()> {
    if o.cameras.is_empty() {
        return Err(reflex_agent::error::bail(
            "name the camera(s) the classifier reads: --camera NAME".into(),
        ));
    }
    if !(0.0..1.0).contains(&o.holdout) {
        return Err(reflex_agent::error::bail(format!(
            "--holdout {} is not a fraction in [0, 1)",
            o.holdout
        )));
    }
    Ok(())
}

/// The recorded frames and their success labels, training's and the held-out episodes' (the
/// last `holdout` of them).
struct LabelledFrames {
    train_f: Option<Frames>,
    held_f: Option<Frames>,
    train_y: Vec<bool>,
    held_y: Vec<bool>,
    /// Per held-out frame: a few frames before a success frame of its episode.
    held_near: Vec<bool>,
    train_eps: usize,
    held_eps: usize,
    n_held: usize,
    /// The commands that recorded the episodes.
    commands: Vec<String>,
}

fn read_labelled(o: &RewardTrainOptions) -> Result<LabelledFrames> {
    let dirs = o.source.episode_dirs()?;
    let mut entries = vec![];
    let mut commands = vec![];
    for d in &dirs {
        let m = reflex_data::demos::read_manifest(d)?;
        entries.extend(m.episodes.into_iter().map(|e| (d.clone(), e)));
        commands.push(m.command);
    }
    let n_eps = entries.len();
    let n_held = ((n_eps as f64 * o.holdout).ceil() as usize).min(n_eps.saturating_sub(1));
    let (mut train_f, mut held_f) = (None, None);
    let (mut train_y, mut held_y) = (vec![], vec![]);
    // Held-out frames a few frames before a success frame of their episode.
    let mut held_near = vec![];
    let mut without_frames = 0;
    let (mut train_eps, mut held_eps) = (0, 0);
    for (k, (dir, e)) in entries.iter().enumerate() {
        let ep = reflex_data::demos::read_episode(dir, e)?;
        // A run's episode that kept no frame (ended before its first, or every frame set
        // dropped) has nothing to learn from; demos recorded without cameras are an error below.
        if ep.cameras.is_empty() && matches!(o.source, RewardSource::Runs(_)) {
            without_frames += 1;
            continue;
        }
        let held = k >= n_eps - n_held;
        // Held-out frames are read at the size the training frames were.
        let size = o.image_size.or_else(|| {
            train_f
                .as_ref()
                .map(|f: &Frames| (f.width as u32, f.height as u32))
        });
        let (f, y) = if held {
            held_eps += 1;
            (&mut held_f, &mut held_y)
        } else {
            train_eps += 1;
            (&mut train_f, &mut train_y)
        };
        add_frames(f, &ep, &o.cameras, size, dir, e)?;
        let labels = success_labels(&ep);
        let frames = (0..ep.frame_count()).map(|j| ep.frame_observation(j));
        if held {
            held_near.extend(frames.clone().map(|i| {
                !labels[i] && labels[i + 1..(i + 1 + NEAR_FRAMES).min(labels.len())].contains(&true)
            }));
        }
        y.extend(frames.map(|i| labels[i]));
    }
    if without_frames > 0 {
        tracing::warn!(
            "{without_frames} of {n_eps} recorded episodes kept no camera frame and are not used"
        );
    }
    Ok(LabelledFrames {
        train_f,
        held_f,
        train_y,
        held_y,
        held_near,
        train_eps,
        held_eps,
        n_held,
        commands,
    })
}

/// The classifier's success probability of every frame in `h`, 256 frames at a time.
fn probabilities(net: &reflex_vision::reward::RewardNet, h: &Frames) -> Result<Vec<f32>> {
    let mut probs = vec![];
    let len = h.frame_len();
    for start in (0..h.len()).step_by(256) {
        let n = 256.min(h.len() - start);
        let views: Vec<&[f32]> = h
            .data
            .iter()
            .map(|d| &d[start * len..(start + n) * len])
            .collect();
        probs.extend(net.probabilities(&views, n).map_err(BcError::from)?);
    }
    Ok(probs)
}

/// The spec's provenance: the command, the data, and the held-out figures.
fn provenance(
    o: &RewardTrainOptions,
    commands: &[String],
    (train_c, held_c): (&FrameCount, &FrameCount),
    confusion: &reflex_vision::reward::Confusion,
    near: u64,
    wall_s: f64,
) -> String {
    format!(
        "{} ({} {}: {}; {} frames of {} episodes, {} success; held out {} episodes, {} frames: accuracy {:.3}, precision {:.3}, recall {:.3}, {} of {} false positives within {NEAR_FRAMES} frames before a success; trained in {:.0} s)",
        o.command,
        match o.source {
            RewardSource::Demos(_) => "demos",
            RewardSource::Runs(_) => "runs",
        },
        o.source.dir().display(),
        commands.join("; "),
        train_c.frames,
        train_c.episodes,
        train_c.successes,
        held_c.episodes,
        held_c.frames,
        confusion.accuracy(),
        confusion.precision(),
        confusion.recall(),
        near,
        confusion.false_positives,
        wall_s
    )
}

/// Writes the classifier's ONNX graph to `out` and its spec beside it; returns the spec's path.
fn write_classifier(
    out: &Path,
    net: &reflex_vision::reward::RewardNet,
    spec: &reflex_vision::reward::RewardSpec,
) -> Result<PathBuf> {
    let onnx = net.to_onnx().map_err(BcError::from)?;
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| AgentError::io(d, e))?;
    }
    reflex_runtime::fsio::atomic_write(out, &onnx).map_err(|e| AgentError::io(out, e))?;
    let sp = reflex_vision::reward::RewardSpec::path_for(out);
    reflex_runtime::fsio::atomic_write(&sp, spec.to_toml().as_bytes())
        .map_err(|e| AgentError::io(&sp, e))?;
    Ok(sp)
}
