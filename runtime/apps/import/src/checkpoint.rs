//! A LeRobot 0.6 `pretrained_model` folder, read and checked before anything heavy runs: the
//! files LeRobot writes there, the policy type, its features and chunk settings, and the
//! processor pipelines' files (LeRobot keeps normalisation outside the weights, so a checkpoint
//! without them cannot act as it did in training).

use crate::ImportError;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Policy types the importer exports (LeRobot's `type` in config.json).
pub const SUPPORTED_TYPES: &[&str] = &["act", "diffusion", "smolvla", "pi0", "pi05"];

/// The preprocessor pipeline LeRobot 0.6 saves beside the weights (normalisation of inputs).
pub const PREPROCESSOR: &str = "policy_preprocessor.json";
/// The postprocessor pipeline (unnormalisation of actions).
pub const POSTPROCESSOR: &str = "policy_postprocessor.json";

/// What a feature is to LeRobot (`type` in config.json's features).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FeatureKind {
    /// `STATE`: the robot's proprioception (`observation.state`).
    State,
    /// `ENV`: the environment's state (`observation.environment_state`).
    Env,
    /// `VISUAL`: a camera image, `[3, height, width]`.
    Visual,
    /// `ACTION`.
    Action,
    /// Anything else (`LANGUAGE`, `REWARD`): not imported yet.
    Other(String),
}

/// One input or output feature of the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feature {
    /// LeRobot's key, e.g. `observation.images.front`.
    pub key: String,
    /// Its type.
    pub kind: FeatureKind,
    /// Its shape without the batch dimension.
    pub shape: Vec<usize>,
}

impl Feature {
    /// Components of one sample.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A LeRobot checkpoint as far as reflex needs to know before exporting it.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    /// The folder.
    pub dir: PathBuf,
    /// LeRobot's policy type (`act`).
    pub policy_type: String,
    /// Input features in config.json's order.
    pub inputs: Vec<Feature>,
    /// The action feature.
    pub action: Feature,
    /// Actions per chunk (ACT's `chunk_size`, Diffusion Policy's `horizon`).
    pub chunk_size: usize,
    /// Actions executed per chunk (`n_action_steps`).
    pub n_action_steps: usize,
    /// The preprocessor's renaming, from the robot's key to the policy's (`rename_map`).
    pub rename_map: Vec<(String, String)>,
}

fn read_json(path: &Path, what: &str) -> Result<Value, ImportError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ImportError::checkpoint(
            path,
            if e.kind() == std::io::ErrorKind::NotFound {
                format!("missing: {what}")
            } else {
                format!("cannot be read ({e})")
            },
        )
    })?;
    serde_json::from_str(&text).map_err(|e| {
        ImportError::checkpoint(
            path,
            format!("is not valid JSON ({e}); the checkpoint is damaged: copy it again"),
        )
    })
}

fn features(config: &Path, v: &Value, key: &str) -> Result<Vec<Feature>, ImportError> {
    let bad = |m: String| ImportError::checkpoint(config, m);
    let map = v
        .get(key)
        .and_then(Value::as_object)
        .ok_or_else(|| bad(format!("`{key}` is missing or not a table of features")))?;
    map.iter()
        .map(|(k, f)| {
            let kind = f
                .get("type")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("`{key}.{k}` has no `type`")))?;
            let shape = f
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|a| {
                    a.iter()
                        .map(|d| d.as_u64().map(|d| d as usize))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| bad(format!("`{key}.{k}.shape` is not a list of sizes")))?;
            Ok(Feature {
                key: k.clone(),
                kind: match kind {
                    "STATE" => FeatureKind::State,
                    "ENV" => FeatureKind::Env,
                    "VISUAL" => FeatureKind::Visual,
                    "ACTION" => FeatureKind::Action,
                    other => FeatureKind::Other(other.into()),
                },
                shape,
            })
        })
        .collect()
}

fn count(config: &Path, v: &Value, key: &str) -> Result<usize, ImportError> {
    v.get(key)
        .and_then(Value::as_u64)
        .filter(|n| *n >= 1)
        .map(|n| n as usize)
        .ok_or_else(|| {
            ImportError::checkpoint(config, format!("`{key}` is not a positive integer"))
        })
}

/// Checks a processor pipeline file and the statistics files its steps name; returns the parsed
/// pipeline.
fn pipeline(dir: &Path, file: &str, role: &str) -> Result<Value, ImportError> {
    let path = dir.join(file);
    let v = read_json(
        &path,
        &format!(
            "LeRobot 0.6 writes the {role} there beside the weights; a checkpoint of LeRobot before \
             0.4 has none (convert it with LeRobot's `lerobot.processor.migrate_policy_normalization`)"
        ),
    )?;
    let steps = v.get("steps").and_then(Value::as_array).ok_or_else(|| {
        ImportError::checkpoint(
            &path,
            "has no `steps` list: not a LeRobot processor pipeline",
        )
    })?;
    for s in steps {
        if let Some(state) = s.get("state_file").and_then(Value::as_str) {
            let p = dir.join(state);
            if !p.is_file() {
                return Err(ImportError::checkpoint(
                    &p,
                    format!(
                        "missing: {file} names it for its statistics; copy the whole checkpoint folder"
                    ),
                ));
            }
        }
    }
    Ok(v)
}

/// The Diffusion Policy settings reflex reproduces, checked before the export: a history of 1 to
/// 64 observation steps (reflex keeps them and executes the chunk from row `n_obs_steps - 1`, as
/// LeRobot does) and LeRobot's two samplers, DDPM and DDIM.
fn diffusion_settings(config: &Path, v: &Value) -> Result<(), ImportError> {
    let unsupported = |what: String| ImportError::Unsupported {
        file: config.display().to_string(),
        what,
        supported:
            "Diffusion Policies with n_obs_steps 1-64 and noise_scheduler_type \"DDPM\" or \"DDIM\""
                .into(),
    };
    let n_obs = v.get("n_obs_steps").and_then(Value::as_u64).unwrap_or(2);
    if !(1..=64).contains(&n_obs) {
        return Err(unsupported(format!("n_obs_steps = {n_obs}")));
    }
    let sched = v
        .get("noise_scheduler_type")
        .and_then(Value::as_str)
        .unwrap_or("DDPM");
    if sched != "DDIM" && sched != "DDPM" {
        return Err(unsupported(format!("noise_scheduler_type = \"{sched}\"")));
    }
    Ok(())
}

/// A VLA's settings reflex reproduces in every case: one observation step, and the cameras the
/// checkpoint has (no `empty_cameras` filled in).
fn one_step_own_cameras(
    v: &Value,
    unsupported: &dyn Fn(String) -> ImportError,
) -> Result<(), ImportError> {
    let n_obs = v.get("n_obs_steps").and_then(Value::as_u64).unwrap_or(1);
    if n_obs != 1 {
        return Err(unsupported(format!("n_obs_steps = {n_obs}")));
    }
    let empty = v.get("empty_cameras").and_then(Value::as_u64).unwrap_or(0);
    if empty != 0 {
        return Err(unsupported(format!("empty_cameras = {empty}")));
    }
    Ok(())
}

/// The SmolVLA settings reflex reproduces, checked before the export: one observation step, the
/// cameras the checkpoint has (no `empty_cameras` filled in) and the robot's own joint space (no
/// Aloha adaptation).
fn smolvla_settings(config: &Path, v: &Value) -> Result<(), ImportError> {
    let unsupported = |what: String| ImportError::Unsupported {
        file: config.display().to_string(),
        what,
        supported: "SmolVLA with n_obs_steps 1, empty_cameras 0 and adapt_to_pi_aloha false".into(),
    };
    one_step_own_cameras(v, &unsupported)?;
    if v.get("adapt_to_pi_aloha").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported("adapt_to_pi_aloha = true".into()));
    }
    Ok(())
}

/// The pi0 and pi0.5 (`name`) settings reflex reproduces, checked before the export: one
/// observation step, the cameras the checkpoint has, float32 weights (what reflex runs and
/// checks against LeRobot) and absolute actions (openpi's relative actions off, LeRobot's
/// default).
fn pi_settings(config: &Path, v: &Value, name: &str) -> Result<(), ImportError> {
    let unsupported = |what: String| ImportError::Unsupported {
        file: config.display().to_string(),
        what,
        supported: format!(
            "{name} with n_obs_steps 1, empty_cameras 0, dtype \"float32\" and use_relative_actions false"
        ),
    };
    one_step_own_cameras(v, &unsupported)?;
    let dtype = v.get("dtype").and_then(Value::as_str).unwrap_or("float32");
    if dtype != "float32" {
        return Err(unsupported(format!(
            "dtype = \"{dtype}\" (set it to \"float32\" to import the weights in float32)"
        )));
    }
    if v.get("use_relative_actions").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported("use_relative_actions = true".into()));
    }
    Ok(())
}

fn rename_map(pre: &Value) -> Vec<(String, String)> {
    let steps = pre.get("steps").and_then(Value::as_array);
    steps
        .into_iter()
        .flatten()
        .filter(|s| {
            s.get("registry_name").and_then(Value::as_str) == Some("rename_observations_processor")
        })
        .filter_map(|s| s.pointer("/config/rename_map").and_then(Value::as_object))
        .flat_map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        })
        .collect()
}

impl Checkpoint {
    /// Reads and checks the checkpoint folder `dir`.
    ///
    /// # Errors
    /// [`ImportError::Checkpoint`] naming the file at fault (a folder that is not a checkpoint,
    /// a missing weights or processor file, malformed JSON), [`ImportError::Unsupported`] for a
    /// policy type reflex does not import yet.
    pub fn open(dir: &Path) -> Result<Self, ImportError> {
        if !dir.is_dir() {
            return Err(ImportError::checkpoint(
                dir,
                "is not a folder: give the `pretrained_model` folder of a LeRobot checkpoint \
                 (e.g. outputs/train/<run>/checkpoints/last/pretrained_model)",
            ));
        }
        let config = dir.join("config.json");
        if !config.is_file() {
            return Err(ImportError::checkpoint(
                &config,
                "missing: not a LeRobot checkpoint (its `pretrained_model` folder holds config.json, \
                 model.safetensors and the policy_preprocessor/postprocessor files)",
            ));
        }
        let v = read_json(&config, "the policy's configuration")?;
        let policy_type = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ImportError::checkpoint(
                    &config,
                    "has no `type`: not a LeRobot policy configuration",
                )
            })?
            .to_string();
        if !SUPPORTED_TYPES.contains(&policy_type.as_str()) {
            return Err(ImportError::Unsupported {
                file: config.display().to_string(),
                what: format!("policy type `{policy_type}`"),
                supported: SUPPORTED_TYPES.join(", "),
            });
        }
        let weights = dir.join("model.safetensors");
        if !weights.is_file() {
            return Err(ImportError::checkpoint(
                &weights,
                "missing: the policy's weights; copy the whole checkpoint folder",
            ));
        }
        let pre = pipeline(dir, PREPROCESSOR, "input normalisation")?;
        pipeline(dir, POSTPROCESSOR, "action unnormalisation")?;
        let inputs = features(&config, &v, "input_features")?;
        let outputs = features(&config, &v, "output_features")?;
        let action = match outputs.as_slice() {
            [a] if a.kind == FeatureKind::Action && a.shape.len() == 1 => a.clone(),
            _ => {
                return Err(ImportError::checkpoint(
                    &config,
                    format!(
                        "`output_features` should be one ACTION vector; it is {:?}",
                        outputs.iter().map(|f| &f.key).collect::<Vec<_>>()
                    ),
                ));
            }
        };
        if policy_type == "diffusion" {
            diffusion_settings(&config, &v)?;
        }
        match policy_type.as_str() {
            "smolvla" => smolvla_settings(&config, &v)?,
            "pi0" => pi_settings(&config, &v, "pi0")?,
            "pi05" => pi_settings(&config, &v, "pi0.5")?,
            _ => {}
        }
        let chunk_size = count(
            &config,
            &v,
            if policy_type == "diffusion" {
                "horizon"
            } else {
                "chunk_size"
            },
        )?;
        let n_action_steps = count(&config, &v, "n_action_steps")?;
        if n_action_steps > chunk_size {
            return Err(ImportError::checkpoint(
                &config,
                format!("`n_action_steps` ({n_action_steps}) exceeds `chunk_size` ({chunk_size})"),
            ));
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            policy_type,
            inputs,
            action,
            chunk_size,
            n_action_steps,
            rename_map: rename_map(&pre),
        })
    }

    /// Whether the policy acts on a language instruction (a vision-language-action model).
    pub fn takes_language(&self) -> bool {
        matches!(self.policy_type.as_str(), "smolvla" | "pi0" | "pi05")
    }

    /// The key the robot's observation carries for the policy's feature `key` (before the
    /// preprocessor renames it).
    pub fn robot_key<'a>(&'a self, key: &'a str) -> &'a str {
        self.rename_map
            .iter()
            .find(|(_, to)| to == key)
            .map_or(key, |(from, _)| from.as_str())
    }
}
