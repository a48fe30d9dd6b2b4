//! What `reflex bc train` runs: a base policy trained on demonstrations (workstation builds).

use crate::policytools::write_model;
use reflex_agent::progress::Progress;
use reflex_agent::{AgentError, error::Result};
use reflex_imitate::{BcError, TrainConfig, make_samples, train};
use reflex_policies::spec::spec_path;
use reflex_vision::encoder::Frames;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where `reflex bc train` reads its episodes.
#[derive(Clone, Debug)]
pub enum TrainSource {
    /// A directory written by `reflex sim demos`.
    Demos(PathBuf),
    /// A LeRobotDataset v3.0 directory, and the state and action features to train on.
    LeRobot {
        /// The dataset's root (with `meta/info.json`).
        dir: PathBuf,
        /// State feature (default `observation.state`).
        state_key: String,
        /// Action feature (default `action`).
        action_key: String,
    },
}

/// What `reflex bc train` asks for.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The episodes.
    pub source: TrainSource,
    /// Output model (its spec is written beside it).
    pub out: PathBuf,
    /// Use only the first N episodes.
    pub episodes: Option<usize>,
    /// Use only the episodes of these indices (reflex's demos and step logs).
    pub only: Option<Vec<u64>>,
    /// In a step log, the policy's steps within this many steps before a person takes over are
    /// not learned from (`None`: every step is). The person stepped in because those steps were
    /// going wrong (RLIF's reading of an intervention); `usize::MAX` drops every policy step
    /// before a takeover.
    pub skip_before_takeover: Option<usize>,
    /// The robot kind to write into the spec instead of the episodes' own.
    pub robot_kind: Option<String>,
    /// The network and optimiser settings.
    pub cfg: TrainConfig,
    /// State fields the policy reads (empty: all of them); reflex's demos only.
    pub state_fields: Vec<String>,
    /// Cameras the policy reads, each through its own encoder; reflex's demos only.
    pub cameras: Vec<String>,
    /// Size the policy reads images at, (width, height) (default: the recorded size).
    pub image_size: Option<(u32, u32)>,
    /// The command that trains it (recorded as the model's provenance).
    pub command: String,
}

/// What training produced.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainReport {
    /// The model written.
    pub model: PathBuf,
    /// Its spec.
    pub spec: PathBuf,
    /// A flow policy's vector-Jacobian-product graph (`<model>.vjp.onnx`, named in the spec).
    pub vjp: Option<PathBuf>,
    /// A policy that sees: its image encoder's convolutions as a frozen encoder file
    /// (`<model>.encoder.onnx`), the features a learner that sees reads.
    pub encoder: Option<PathBuf>,
    /// Final loss.
    pub final_loss: f32,
    /// Wall time, s.
    pub wall_s: f64,
}

/// Trains a diffusion or flow policy on recorded episodes and exports it to ONNX with its spec.
pub fn bc_train(o: &TrainOptions, progress: &dyn Progress) -> Result<TrainReport> {
    // The episodes, the action size, the robot kind and where they came from.
    let mut frames = None;
    let mut keep = None;
    let (mut eps, action_dim, kind, origin) = match &o.source {
        TrainSource::Demos(dir) => demos_episodes(o, dir, &mut frames, &mut keep)?,
        TrainSource::LeRobot { dir, .. } if !o.state_fields.is_empty() => {
            return Err(reflex_agent::error::bail(format!(
                "{}: --state-fields reads reflex's demos (--demos); a LeRobot dataset's state is \
                 one feature (--state-key)",
                dir.display()
            )));
        }
        TrainSource::LeRobot {
            dir,
            state_key,
            action_key,
        } => {
            let mut d = reflex_data::dataset::read_lerobot(dir, state_key, action_key)?;
            d.episodes.truncate(o.episodes.unwrap_or(d.episodes.len()));
            if !o.cameras.is_empty() {
                frames = Some(lerobot_frames(dir, &o.cameras, o.image_size, &d.episodes)?);
            }
            let origin = format!(
                "LeRobot dataset {} ({state_key}{} -> {action_key})",
                dir.display(),
                o.cameras
                    .iter()
                    .map(|c| format!(", camera {c}"))
                    .collect::<String>()
            );
            (d.episodes, d.action_dim, d.robot_type, origin)
        }
    };
    let kind = o.robot_kind.clone().or(kind);
    eps.truncate(o.episodes.unwrap_or(eps.len()));
    let take = eps.len();
    let mut samples = make_samples(&eps, o.cfg.horizon);
    if let Some(keep) = keep {
        // One flag per step of the kept episodes, in make_samples' order.
        let keep: Vec<bool> = keep.into_iter().take(take).flatten().collect();
        if frames.is_some() || keep.len() != samples.len() {
            return Err(reflex_agent::error::bail(
                "skipping the steps before a takeover works on a step log's state only (no cameras)"
                    .to_string(),
            ));
        }
        let mut flags = keep.into_iter();
        samples.retain(|_| flags.next().unwrap_or(true));
    }
    let name = o
        .out
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "policy".into());
    tracing::info!(
        "training `{name}` on {take} episodes ({} samples{}) from {origin}",
        samples.len(),
        frames.as_ref().map_or(String::new(), |f| format!(
            ", cameras {:?} at {}x{}",
            f.cameras, f.width, f.height
        )),
    );
    progress.start(o.cfg.steps as u64, "steps");
    let t0 = Instant::now();
    let mut last = 0u64;
    let mut trained = train(
        &samples,
        frames.as_ref(),
        action_dim,
        &o.cfg,
        &name,
        o.state_fields.clone(),
        kind,
        |step, loss| {
            progress.inc(step as u64 - last.min(step as u64));
            last = step as u64;
            progress.message(&format!("loss {loss:.4}"));
        },
    )?;
    progress.finish();
    trained.spec.provenance = Some(format!(
        "{} ({origin}; {take} episodes, {} samples; trained in {:.0} s)",
        o.command,
        samples.len(),
        t0.elapsed().as_secs_f64()
    ));
    let onnx = trained.net.to_onnx()?;
    // A flow policy's VJP graph goes first: the spec that names it is written last.
    let vjp = write_vjp(&mut trained, &o.out)?;
    write_model(&o.out, &onnx, &trained.spec)?;
    let encoder = write_encoder(&trained, &o.out, &name)?;
    Ok(TrainReport {
        model: o.out.clone(),
        spec: spec_path(&o.out),
        vjp,
        encoder,
        final_loss: trained.losses.last().copied().unwrap_or(f32::NAN),
        wall_s: t0.elapsed().as_secs_f64(),
    })
}

/// The episodes of reflex's demos in `dir` (the state fields `o` names, and the frames of its
/// cameras into `frames`), the action size, the robot kind and where they came from.
fn demos_episodes(
    o: &TrainOptions,
    dir: &Path,
    frames: &mut Option<Frames>,
    keep: &mut Option<Vec<Vec<bool>>>,
) -> Result<(
    Vec<reflex_imitate::EpisodeData>,
    usize,
    Option<String>,
    String,
)> {
    let m = reflex_data::demos::read_manifest(dir)?;
    let take = o.episodes.unwrap_or(m.episodes.len()).min(m.episodes.len());
    let ranges = state_ranges(&m.spec, &o.state_fields, dir)?;
    let mut eps = vec![];
    let chosen = m.episodes[..take]
        .iter()
        .filter(|e| o.only.as_ref().is_none_or(|k| k.contains(&e.index)));
    for e in chosen {
        let ep = reflex_data::demos::read_episode(dir, e)?;
        if let Some(k) = o.skip_before_takeover {
            keep.get_or_insert_with(Vec::new).push(before_takeover_kept(
                &ep.actors,
                ep.actions.len(),
                k,
            ));
        }
        if !o.cameras.is_empty() && !ep.actions.is_empty() {
            if !ep.frame_observations.is_empty() {
                return Err(reflex_agent::error::bail(format!(
                    "{}: episode {} kept camera frames at some steps only (a run's step \
                     log above 15 Hz); behaviour cloning needs the frame of every step: \
                     record with `reflex sim demos --cameras`, or export the run with \
                     `reflex dataset export` and train from the dataset",
                    dir.join(&e.file).display(),
                    e.index
                )));
            }
            let f = add_frames(frames, &ep, &o.cameras, o.image_size, dir, e)?;
            // One frame per sample: the observations that have an action.
            f.truncate_to(f.len() - 1);
        }
        let obs = match &ranges {
            Some(r) => ep
                .observations
                .iter()
                .map(|s| {
                    r.iter()
                        .flat_map(|r| s[r.clone()].iter().copied())
                        .collect()
                })
                .collect(),
            None => ep.observations,
        };
        eps.push((obs, ep.actions));
    }
    let origin = format!("demos {}: {}", dir.display(), m.command);
    Ok((eps, m.spec.action.dim(), Some(m.spec.kind.clone()), origin))
}

/// Which of an episode's `steps` are learned from: all but the policy's steps (`actors` 0)
/// within `window` steps before a person's takeover (a step of `actors` 1 after one of 0). An
/// episode with no record of who acted keeps every step.
pub fn before_takeover_kept(actors: &[u8], steps: usize, window: usize) -> Vec<bool> {
    let mut keep = vec![true; steps];
    for t in 1..actors.len().min(steps) {
        if actors[t] == 1 && actors[t - 1] == 0 {
            let from = t.saturating_sub(window);
            for (k, a) in keep[from..t].iter_mut().zip(&actors[from..t]) {
                if *a == 0 {
                    *k = false;
                }
            }
        }
    }
    keep
}

/// A flow policy's VJP graph beside `out`, named in its spec (`None`: not a flow policy).
fn write_vjp(trained: &mut reflex_imitate::Trained, out: &Path) -> Result<Option<PathBuf>> {
    if trained.spec.kind != reflex_policies::spec::PolicyKind::Flow {
        return Ok(None);
    }
    let path = reflex_policies::spec::vjp_path_for(out);
    let bytes = trained.net.to_onnx_vjp()?;
    reflex_runtime::fsio::atomic_write(&path, &bytes).map_err(|e| AgentError::io(&path, e))?;
    trained.spec.graph.vjp = Some(reflex_policies::spec::VjpGraph {
        file: path
            .file_name()
            .map(|f| f.to_string_lossy().to_string())
            .unwrap_or_default(),
        cotangent_input: "cotangent".into(),
        output: "vjp".into(),
    });
    Ok(Some(path))
}

/// The frozen image encoder of a policy that sees, beside `out` with its spec (`None`: it sees
/// nothing).
fn write_encoder(
    trained: &reflex_imitate::Trained,
    out: &Path,
    name: &str,
) -> Result<Option<PathBuf>> {
    if trained.net.encoders().is_empty() {
        return Ok(None);
    }
    let path = reflex_policies::features::encoder_path_for(out);
    let (bytes, spec) = reflex_vision::encoder::frozen_encoder(
        trained.net.encoders(),
        &format!("{name}.encoder"),
        Some(format!("the image encoder of `{}`, frozen", out.display())),
    )
    .map_err(BcError::from)?;
    reflex_runtime::fsio::atomic_write(&path, &bytes).map_err(|e| AgentError::io(&path, e))?;
    let sp = reflex_policies::features::encoder_spec_path(&path);
    reflex_runtime::fsio::atomic_write(&sp, spec.to_toml().as_bytes())
        .map_err(|e| AgentError::io(&sp, e))?;
    Ok(Some(path))
}

/// The ranges of `fields` in the demos' state vector (`None`: all of it); an unknown field is
/// named with the ones there are.
fn state_ranges(
    spec: &reflex_runtime::msg::RobotSpec,
    fields: &[String],
    dir: &Path,
) -> Result<Option<Vec<std::ops::Range<usize>>>> {
    if fields.is_empty() {
        return Ok(None);
    }
    let ranges = fields
        .iter()
        .map(|f| {
            spec.field(f).ok_or_else(|| {
                reflex_agent::error::bail(format!(
                    "{}: the demos' state has no field `{f}`; it has {:?}",
                    dir.display(),
                    spec.state.iter().map(|s| &s.name).collect::<Vec<_>>()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(ranges))
}

/// Appends an episode's frames of `cameras` to `frames` (one per observation, or one per entry of
/// its `frame_observations`); the first episode fixes the size unless `size` does.
pub(crate) fn add_frames<'a>(
    frames: &'a mut Option<Frames>,
    ep: &reflex_data::demos::Episode,
    cameras: &[String],
    size: Option<(u32, u32)>,
    dir: &Path,
    entry: &reflex_data::demos::EpisodeEntry,
) -> Result<&'a mut Frames> {
    let streams = cameras
        .iter()
        .map(|c| {
            ep.cameras.iter().find(|s| &s.camera == c).ok_or_else(|| {
                reflex_agent::error::bail(format!(
                    "{}: episode {} has no frames of camera `{c}` (it has {:?}); record with \
                     `reflex sim demos --cameras`",
                    dir.join(&entry.file).display(),
                    entry.index,
                    ep.cameras.iter().map(|s| &s.camera).collect::<Vec<_>>()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let f = frames.get_or_insert_with(|| {
        let (w, h) = size.unwrap_or((streams[0].width, streams[0].height));
        Frames {
            cameras: cameras.to_vec(),
            width: w as usize,
            height: h as usize,
            data: vec![],
        }
    });
    for t in 0..ep.frame_count() {
        let images: Vec<_> = streams.iter().map(|s| s.image(t)).collect();
        f.push(&images);
    }
    Ok(f)
}

/// The frames of `cameras` from a LeRobot dataset's video features, one per frame of `eps` (the
/// dataset's rows, episode by episode); every episode must have as many frames as rows.
fn lerobot_frames(
    dir: &Path,
    cameras: &[String],
    size: Option<(u32, u32)>,
    eps: &[reflex_data::dataset::EpisodeData],
) -> Result<Frames> {
    let mut frames: Option<Frames> = None;
    for (c, camera) in cameras.iter().enumerate() {
        let mut per_episode = vec![0usize; eps.len()];
        let key = reflex_data::videos::read_camera(dir, camera, eps.len(), |e, rgb, w, h| {
            let f = frames.get_or_insert_with(|| {
                let (fw, fh) = size.unwrap_or((w, h));
                Frames {
                    cameras: cameras.to_vec(),
                    width: fw as usize,
                    height: fh as usize,
                    data: vec![],
                }
            });
            let image = reflex_runtime::msg::Image {
                camera: camera.clone(),
                width: w,
                height: h,
                encoding: "rgb8".into(),
                data: rgb.to_vec(),
                seq: 0,
                age_ns: 0,
            };
            f.push_camera(c, &image);
            per_episode[e] += 1;
            Ok(())
        })?;
        if let Some(e) = (0..eps.len()).find(|e| per_episode[*e] != eps[*e].0.len()) {
            return Err(reflex_agent::error::bail(format!(
                "{}: episode {e} has {} frames of `{key}` and {} rows of data",
                dir.display(),
                per_episode[e],
                eps[e].0.len()
            )));
        }
    }
    frames.ok_or_else(|| reflex_agent::error::bail(format!("{}: no frames", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::before_takeover_kept;

    #[test]
    fn the_policys_steps_just_before_a_takeover_are_left_out_and_nothing_else() {
        // policy 0-4, person 5-6, policy 7-8, person 9.
        let actors = [0, 0, 0, 0, 0, 1, 1, 0, 0, 1];
        let kept = |w| before_takeover_kept(&actors, actors.len(), w);
        assert_eq!(
            kept(2),
            [
                true, true, true, false, false, true, true, false, false, true
            ]
        );
        // A window reaching past the person's own steps leaves those in.
        assert_eq!(
            kept(4),
            [
                true, false, false, false, false, true, true, false, false, true
            ]
        );
        assert_eq!(
            kept(usize::MAX),
            [
                false, false, false, false, false, true, true, false, false, true
            ]
        );
        assert!(kept(0).iter().all(|k| *k));
        // No takeover, or no record of who acted: every step is kept.
        assert!(before_takeover_kept(&[0; 6], 6, 3).iter().all(|k| *k));
        assert!(before_takeover_kept(&[], 6, 3).iter().all(|k| *k));
        // A demonstration (the person from the first step) has no takeover to lead to.
        assert!(before_takeover_kept(&[1; 4], 4, 3).iter().all(|k| *k));
    }
}
