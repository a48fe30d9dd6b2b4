//! Checkpoints: everything that defines the learner's future, written atomically (temporary file,
//! fsync, rename) so that a crash leaves the previous checkpoint intact, and restored exactly, so
//! that training resumes as if it had never stopped (same seed -> same parameters).
//!
//! Contents: configuration, actor, critics, target critics, temperature, the three optimisers'
//! moments and step counts, both replay buffers, the generator's exact position, and the counters.
//! (Field notes: resume bugs that reset the temperature or re-initialised the actor were reported
//! in LeRobot PRs #2877 and #4560; a test here compares every byte of state.)

use super::replay::Replay;
use super::{Counters, Sac, SacConfig};
use candle_core::{Device, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Errors writing or reading a checkpoint; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// I/O.
    #[error("checkpoint `{path}`: {source}")]
    Io {
        /// File.
        path: String,
        /// Error.
        source: std::io::Error,
    },
    /// Not a checkpoint of this version, or corrupt.
    #[error("checkpoint `{path}` cannot be read: {message}")]
    Format {
        /// File.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor operation failed.
    #[error("checkpoint: {0}")]
    Candle(#[from] candle_core::Error),
}

#[derive(Serialize, Deserialize)]
struct Blob {
    shape: Vec<usize>,
    data: Vec<f32>,
}

#[derive(Serialize, Deserialize)]
struct AdamState {
    m: Vec<Blob>,
    v: Vec<Blob>,
    t: u64,
}

/// What a checkpoint holds, borrowed for writing (the replay buffers are not copied).
#[derive(Serialize)]
struct FileOut<'a> {
    format: &'a str,
    version: u16,
    cfg: &'a SacConfig,
    obs_dim: usize,
    act_dim: usize,
    actor: Vec<Blob>,
    critic: Vec<Blob>,
    target: Vec<Blob>,
    heads: Vec<Blob>,
    target_heads: Vec<Blob>,
    log_alpha: Blob,
    opts: Vec<AdamState>,
    online: &'a Replay,
    demo: &'a Replay,
    rng_seed: [u8; 32],
    rng_stream: u64,
    rng_word_pos: u128,
    counters: Counters,
    tags: &'a std::collections::BTreeMap<String, u64>,
}

#[derive(Deserialize)]
struct File {
    format: String,
    version: u16,
    cfg: SacConfig,
    obs_dim: usize,
    act_dim: usize,
    actor: Vec<Blob>,
    critic: Vec<Blob>,
    target: Vec<Blob>,
    #[serde(default)]
    heads: Vec<Blob>,
    #[serde(default)]
    target_heads: Vec<Blob>,
    log_alpha: Blob,
    opts: Vec<AdamState>,
    online: Replay,
    demo: Replay,
    rng_seed: [u8; 32],
    rng_stream: u64,
    rng_word_pos: u128,
    counters: Counters,
    #[serde(default)]
    tags: std::collections::BTreeMap<String, u64>,
}

fn blob(t: &Tensor) -> candle_core::Result<Blob> {
    Ok(Blob {
        shape: t.dims().to_vec(),
        data: t.flatten_all()?.to_vec1::<f32>()?,
    })
}

fn tensor(b: &Blob) -> candle_core::Result<Tensor> {
    Tensor::from_slice(&b.data, b.shape.as_slice(), &Device::Cpu)
}

fn set_all(vars: &[Var], blobs: &[Blob]) -> candle_core::Result<()> {
    if vars.len() != blobs.len() {
        return Err(candle_core::Error::Msg(format!(
            "checkpoint holds {} tensors where the network has {}",
            blobs.len(),
            vars.len()
        )));
    }
    for (v, b) in vars.iter().zip(blobs) {
        v.set(&tensor(b)?)?;
    }
    Ok(())
}

impl Sac {
    /// Writes the whole learner state to `path` atomically.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let blobs = |vs: Vec<Var>| {
            vs.iter()
                .map(|v| blob(v.as_tensor()))
                .collect::<candle_core::Result<Vec<_>>>()
        };
        let adam = |a: &super::adam::Adam| -> candle_core::Result<AdamState> {
            let (m, v, t) = a.state()?;
            Ok(AdamState {
                m: m.iter().map(blob).collect::<candle_core::Result<_>>()?,
                v: v.iter().map(blob).collect::<candle_core::Result<_>>()?,
                t,
            })
        };
        let f = FileOut {
            format: "reflex-sac-checkpoint",
            version: 1,
            cfg: &self.cfg,
            // The state's width: what `Sac::new` takes (the row adds the feature maps).
            obs_dim: self.state_dim,
            act_dim: self.act_dim,
            actor: blobs(self.actor.net.vars())?,
            critic: blobs(self.critic.vars())?,
            target: blobs(self.target.vars())?,
            heads: blobs(self.heads.iter().flat_map(|h| h.vars()).collect())?,
            target_heads: blobs(self.target_heads.iter().flat_map(|h| h.vars()).collect())?,
            log_alpha: blob(self.log_alpha.as_tensor())?,
            opts: vec![
                adam(&self.actor_opt)?,
                adam(&self.critic_opt)?,
                adam(&self.alpha_opt)?,
            ],
            online: &self.online,
            demo: &self.demo,
            rng_seed: self.rng.get_seed(),
            rng_stream: self.rng.get_stream(),
            rng_word_pos: self.rng.get_word_pos(),
            counters: self.counters,
            tags: &self.tags,
        };
        let bytes = rmp_serde::to_vec_named(&f).map_err(|e| CheckpointError::Format {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        reflex_runtime::fsio::atomic_write(path, &bytes).map_err(|source| CheckpointError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Restores a learner from `path`.
    pub fn load(path: &Path) -> Result<Sac, CheckpointError> {
        let p = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            path: p.clone(),
            source,
        })?;
        let f: File = rmp_serde::from_slice(&bytes).map_err(|e| CheckpointError::Format {
            path: p.clone(),
            message: e.to_string(),
        })?;
        if f.format != "reflex-sac-checkpoint" || f.version != 1 {
            return Err(CheckpointError::Format {
                path: p,
                message: format!("format {} version {}", f.format, f.version),
            });
        }
        let mut s = Sac::new(f.cfg, f.obs_dim, f.act_dim)?;
        set_all(&s.actor.net.vars(), &f.actor)?;
        set_all(&s.critic.vars(), &f.critic)?;
        set_all(&s.target.vars(), &f.target)?;
        let vars = |hs: &[reflex_vision::head::SpatialHead]| -> Vec<Var> {
            hs.iter().flat_map(|h| h.vars()).collect()
        };
        set_all(&vars(&s.heads), &f.heads)?;
        set_all(&vars(&s.target_heads), &f.target_heads)?;
        s.log_alpha.set(&tensor(&f.log_alpha)?)?;
        if f.opts.len() != 3 {
            return Err(CheckpointError::Format {
                path: p,
                message: format!(
                    "{} optimiser states where a learner has 3 (actor, critics, temperature)",
                    f.opts.len()
                ),
            });
        }
        for (opt, st) in [&mut s.actor_opt, &mut s.critic_opt, &mut s.alpha_opt]
            .into_iter()
            .zip(f.opts)
        {
            let m =
                st.m.iter()
                    .map(tensor)
                    .collect::<candle_core::Result<Vec<_>>>()?;
            let v =
                st.v.iter()
                    .map(tensor)
                    .collect::<candle_core::Result<Vec<_>>>()?;
            opt.restore(m, v, st.t)?;
        }
        s.online = f.online;
        s.demo = f.demo;
        let mut rng = ChaCha8Rng::from_seed(f.rng_seed);
        rng.set_stream(f.rng_stream);
        rng.set_word_pos(f.rng_word_pos);
        s.rng = rng;
        s.counters = f.counters;
        s.tags = f.tags;
        Ok(s)
    }
}
