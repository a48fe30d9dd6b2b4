//! LeRobotDataset v3.0 out and in (docs/datasets.md): `reflex dataset export` writes reflex's
//! recorded episodes in the layout LeRobot's `LeRobotDataset` loads, and `reflex bc train
//! --dataset` reads such a dataset (one LeRobot users already have) by feature name.
//!
//! The layout follows huggingface/lerobot `src/lerobot/datasets/utils.py` (codebase v3.0):
//! `meta/info.json`, `meta/stats.json`, `meta/tasks.parquet` (pandas index `task`),
//! `meta/episodes/chunk-000/file-000.parquet` (one row per episode with its frame range), and
//! `data/chunk-NNN/file-NNN.parquet` (one row per frame; vectors as fixed-size lists, shape-[1]
//! features as scalars; many episodes per file, a new file past 100 MB, 1000 files per chunk).
//! Every file is written whole and renamed into place, `info.json` last: a crash leaves a
//! directory without `info.json`, which no loader takes for a dataset.

use crate::demos::{Episode, read_episode, read_manifest};
use crate::{DataError, Result};
use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
    StringArray,
};
use arrow_schema::{DataType, Field, Schema};
use reflex_contracts::msg::RobotSpec;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One episode's observations and actions, frame by frame (what behaviour cloning reads).
pub type EpisodeData = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The LeRobot dataset format version written and read.
pub const CODEBASE_VERSION: &str = "v3.0";
/// Files per chunk directory (LeRobot's DEFAULT_CHUNK_SIZE).
const CHUNK_SIZE: usize = 1000;
/// A data file is closed past this size (LeRobot's DEFAULT_DATA_FILE_SIZE_IN_MB).
const DATA_FILE_MB: usize = 100;
/// Quantiles in stats.json (LeRobot's DEFAULT_QUANTILES).
const QUANTILES: [(f64, &str); 5] = [
    (0.01, "q01"),
    (0.10, "q10"),
    (0.50, "q50"),
    (0.90, "q90"),
    (0.99, "q99"),
];

fn bad(path: &Path, message: impl Into<String>) -> DataError {
    DataError::invalid(format!("dataset `{}`", path.display()), message.into())
}

/// What `reflex dataset export` is asked.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// A directory of recorded episodes (`reflex sim demos`, or a run's `steps/`).
    pub demos: PathBuf,
    /// The dataset directory to create (must not exist or be empty).
    pub out: PathBuf,
    /// The task, in words (default: the robot's kind).
    pub task: Option<String>,
}

/// What an export wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ExportReport {
    /// Episodes.
    pub episodes: usize,
    /// Frames (steps).
    pub frames: usize,
    /// Data files.
    pub data_files: usize,
    /// Video files (one camera's frames of many episodes each).
    pub video_files: usize,
    /// Features, by name.
    pub features: Vec<String>,
}

/// One feature column while it is being gathered.
struct Column {
    name: String,
    /// Values per frame (1: a scalar column).
    width: usize,
    kind: Kind,
    names: Option<Vec<String>>,
    f32s: Vec<f32>,
    i64s: Vec<i64>,
    bools: Vec<bool>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    F32,
    I64,
    Bool,
}

impl Column {
    fn new(name: &str, width: usize, kind: Kind, names: Option<Vec<String>>) -> Self {
        Column {
            name: name.into(),
            width,
            kind,
            names,
            f32s: vec![],
            i64s: vec![],
            bools: vec![],
        }
    }

    fn dtype(&self) -> &'static str {
        match self.kind {
            Kind::F32 => "float32",
            Kind::I64 => "int64",
            Kind::Bool => "bool",
        }
    }

    /// The Arrow array of rows `from..to` (frames).
    fn array(&self, from: usize, to: usize) -> ArrayRef {
        let w = self.width;
        match (self.kind, w) {
            (Kind::F32, 1) => Arc::new(Float32Array::from(self.f32s[from..to].to_vec())),
            (Kind::I64, 1) => Arc::new(Int64Array::from(self.i64s[from..to].to_vec())),
            (Kind::Bool, _) => Arc::new(BooleanArray::from(self.bools[from..to].to_vec())),
            (Kind::F32, _) => Arc::new(FixedSizeListArray::new(
                Arc::new(Field::new("item", DataType::Float32, true)),
                w as i32,
                Arc::new(Float32Array::from(self.f32s[from * w..to * w].to_vec())),
                None,
            )),
            (Kind::I64, _) => unreachable!("integer features are scalars"),
        }
    }

    fn field(&self) -> Field {
        let item = match self.kind {
            Kind::F32 => DataType::Float32,
            Kind::I64 => DataType::Int64,
            Kind::Bool => DataType::Boolean,
        };
        let dt = if self.width == 1 || self.kind == Kind::Bool {
            item
        } else {
            DataType::FixedSizeList(Arc::new(Field::new("item", item, true)), self.width as i32)
        };
        Field::new(&self.name, dt, true)
    }

    /// LeRobot's feature entry for info.json.
    fn info(&self, fps: f64) -> serde_json::Value {
        serde_json::json!({
            "dtype": self.dtype(),
            "shape": [self.width],
            "names": self.names,
            "fps": fps_value(fps),
        })
    }

    /// min, max, mean, std, count and quantiles per component (numeric features).
    fn stats(&self) -> Option<serde_json::Value> {
        let w = self.width;
        let rows = match self.kind {
            Kind::F32 => self.f32s.len() / w,
            Kind::I64 => self.i64s.len(),
            Kind::Bool => return None,
        };
        let value = |r: usize, k: usize| match self.kind {
            Kind::F32 => self.f32s[r * w + k] as f64,
            _ => self.i64s[r] as f64,
        };
        let mut out = serde_json::Map::new();
        let (mut mins, mut maxs, mut means, mut stds) = (vec![], vec![], vec![], vec![]);
        let mut qs: Vec<Vec<f64>> = vec![vec![]; QUANTILES.len()];
        for k in 0..w {
            let mut v: Vec<f64> = (0..rows).map(|r| value(r, k)).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len().max(1) as f64;
            let mean = v.iter().sum::<f64>() / n;
            let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
            mins.push(*v.first().unwrap_or(&0.0));
            maxs.push(*v.last().unwrap_or(&0.0));
            means.push(mean);
            stds.push(var.sqrt());
            for (slot, (q, _)) in qs.iter_mut().zip(QUANTILES) {
                slot.push(quantile(&v, q));
            }
        }
        out.insert("min".into(), mins.into());
        out.insert("max".into(), maxs.into());
        out.insert("mean".into(), means.into());
        out.insert("std".into(), stds.into());
        out.insert("count".into(), vec![rows as u64].into());
        for (vals, (_, name)) in qs.into_iter().zip(QUANTILES) {
            out.insert(name.into(), vals.into());
        }
        Some(out.into())
    }
}

/// The `q` quantile of sorted `v`, linear between neighbours (numpy's default). Not the reports'
/// nearest-rank percentile (`reflex_runtime::hist::percentile`): these are dataset statistics
/// that LeRobot computes with numpy, and they must match its own.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Per-component names of the state vector: the field name, or `field.k` for a vector field.
fn state_names(spec: &RobotSpec) -> Vec<String> {
    spec.state
        .iter()
        .flat_map(|f| {
            (0..f.size as usize).map(move |k| {
                if f.size == 1 {
                    f.name.clone()
                } else {
                    format!("{}.{k}", f.name)
                }
            })
        })
        .collect()
}

fn parquet_bytes(batch: &RecordBatch, path: &Path) -> Result<Vec<u8>> {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut buf = vec![];
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, batch.schema(), Some(props))
        .map_err(|e| bad(path, e.to_string()))?;
    w.write(batch).map_err(|e| bad(path, e.to_string()))?;
    w.close().map_err(|e| bad(path, e.to_string()))?;
    Ok(buf)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| DataError::io(d, e))?;
    }
    reflex_runtime::fsio::atomic_write(path, bytes).map_err(|e| DataError::io(path, e))
}

fn chunk_file(dir: &str, index: usize) -> String {
    format!(
        "{dir}/chunk-{:03}/file-{:03}.parquet",
        index / CHUNK_SIZE,
        index % CHUNK_SIZE
    )
}

/// The frames of `episodes` as feature columns.
fn columns(spec: &RobotSpec, episodes: &[Episode], fps: f64) -> Vec<Column> {
    let (s, a) = (spec.state_dim(), spec.action.dim());
    let acted = episodes.iter().all(|e| !e.actors.is_empty());
    let mut c = vec![
        Column::new("observation.state", s, Kind::F32, Some(state_names(spec))),
        Column::new("action", a, Kind::F32, Some(spec.action.names.clone())),
        Column::new("next.reward", 1, Kind::F32, None),
        Column::new("next.done", 1, Kind::Bool, None),
        Column::new("next.success", 1, Kind::Bool, None),
    ];
    if acted {
        c.push(Column::new("reflex.person", 1, Kind::Bool, None));
        c.push(Column::new(
            "reflex.base_action",
            a,
            Kind::F32,
            Some(spec.action.names.clone()),
        ));
        c.push(Column::new(
            "reflex.residual",
            a,
            Kind::F32,
            Some(spec.action.names.clone()),
        ));
    }
    c.push(Column::new("timestamp", 1, Kind::F32, None));
    for d in ["frame_index", "episode_index", "index", "task_index"] {
        c.push(Column::new(d, 1, Kind::I64, None));
    }
    let mut index = 0i64;
    for (e, ep) in episodes.iter().enumerate() {
        let n = ep.actions.len();
        for t in 0..n {
            let last = t + 1 == n;
            for col in c.iter_mut() {
                match col.name.as_str() {
                    "observation.state" => col.f32s.extend_from_slice(&ep.observations[t]),
                    "action" => col.f32s.extend_from_slice(&ep.actions[t]),
                    "next.reward" => col.f32s.push(ep.rewards[t]),
                    "next.done" => col.bools.push(last),
                    "next.success" => col.bools.push(last && ep.success),
                    "reflex.person" => col.bools.push(ep.actors[t] != 0),
                    "reflex.base_action" => col.f32s.extend_from_slice(&ep.base_actions[t]),
                    "reflex.residual" => col.f32s.extend_from_slice(&ep.residuals[t]),
                    "timestamp" => col.f32s.push((t as f64 / fps) as f32),
                    "frame_index" => col.i64s.push(t as i64),
                    "episode_index" => col.i64s.push(e as i64),
                    "index" => col.i64s.push(index),
                    "task_index" => col.i64s.push(0),
                    other => unreachable!("no column {other}"),
                }
            }
            index += 1;
        }
    }
    c
}

/// Checks an episode read from disk before its values become frames.
fn check_episode(spec: &RobotSpec, ep: &Episode, file: &Path) -> Result<()> {
    let (s, a, n) = (spec.state_dim(), spec.action.dim(), ep.actions.len());
    let what = if ep.observations.len() < n || ep.rewards.len() != n {
        Some(format!(
            "{n} actions, {} observations, {} rewards",
            ep.observations.len(),
            ep.rewards.len()
        ))
    } else if ep.observations.iter().any(|o| o.len() != s)
        || ep.actions.iter().any(|x| x.len() != a)
    {
        Some(format!(
            "states or actions of another size than the robot's ({s}, {a})"
        ))
    } else if !ep.actors.is_empty()
        && (ep.actors.len() != n || ep.base_actions.len() != n || ep.residuals.len() != n)
    {
        Some("who acted, base actions or residuals not one per step".into())
    } else {
        None
    };
    match what {
        Some(w) => Err(bad(file, format!("episode {}: {w}", ep.index))),
        None => Ok(()),
    }
}

/// Writes the episodes of `o.demos` as a LeRobotDataset v3.0 in `o.out`.
pub fn export_lerobot(o: &ExportOptions) -> Result<ExportReport> {
    if o.out.exists()
        && std::fs::read_dir(&o.out)
            .map_err(|e| DataError::io(&o.out, e))?
            .next()
            .is_some()
    {
        return Err(bad(
            &o.out,
            "exists and is not empty; choose a new directory",
        ));
    }
    let m = read_manifest(&o.demos)?;
    let spec = &m.spec;
    let mut episodes = Vec::with_capacity(m.episodes.len());
    let mut files = Vec::with_capacity(m.episodes.len());
    for e in &m.episodes {
        let ep = read_episode(&o.demos, e)?;
        let file = o.demos.join(&e.file);
        check_episode(spec, &ep, &file)?;
        episodes.push(ep);
        files.push(file);
    }
    if episodes.iter().all(|e| e.actions.is_empty()) {
        return Err(bad(&o.demos, "has no steps to export"));
    }
    let fps = spec.control_hz;
    let cols = columns(spec, &episodes, fps);
    let frames = cols[0].f32s.len() / cols[0].width;
    let (ep_rows, data_files) = write_all_data(&o.out, &cols, &episodes)?;
    let videos = crate::videos::write_videos(&o.out, &episodes, &files, fps)?;
    let task = o.task.clone().unwrap_or_else(|| spec.kind.clone());
    write_episodes(&o.out, &ep_rows, &videos, &task)?;
    write_tasks(&o.out, &task)?;
    let stats: serde_json::Map<String, serde_json::Value> = cols
        .iter()
        .filter_map(|c| Some((c.name.clone(), c.stats()?)))
        .chain(videos.iter().map(|v| (v.key.clone(), v.stats.clone())))
        .collect();
    let stats_path = o.out.join("meta/stats.json");
    write_file(
        &stats_path,
        &serde_json::to_vec_pretty(&stats).expect("plain values"),
    )?;
    let features: serde_json::Map<String, serde_json::Value> = cols
        .iter()
        .map(|c| (c.name.clone(), c.info(fps)))
        .chain(videos.iter().map(|v| (v.key.clone(), v.info())))
        .collect();
    let video_path = (!videos.is_empty())
        .then_some("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4");
    let info = serde_json::json!({
        "codebase_version": CODEBASE_VERSION,
        "robot_type": spec.kind,
        "total_episodes": episodes.len(),
        "total_frames": frames,
        "total_tasks": 1,
        "chunks_size": CHUNK_SIZE,
        "data_files_size_in_mb": DATA_FILE_MB,
        "video_files_size_in_mb": crate::videos::VIDEO_FILE_MB,
        "fps": fps_value(fps),
        "splits": {"train": format!("0:{}", episodes.len())},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": video_path,
        "features": features,
        "reflex": {"source": o.demos.display().to_string(), "command": m.command},
    });
    let info_path = o.out.join("meta/info.json");
    write_file(
        &info_path,
        &serde_json::to_vec_pretty(&info).expect("plain values"),
    )?;
    Ok(ExportReport {
        episodes: episodes.len(),
        frames,
        data_files,
        video_files: videos.iter().map(|v| v.files).sum(),
        features: cols
            .iter()
            .map(|c| c.name.clone())
            .chain(videos.iter().map(|v| v.key.clone()))
            .collect(),
    })
}

/// Writes the columns into data files of about `DATA_FILE_MB`, episodes whole; returns each
/// episode's rows and file, and the number of files.
fn write_all_data(
    out: &Path,
    cols: &[Column],
    episodes: &[Episode],
) -> Result<(Vec<EpisodeRow>, usize)> {
    let schema = Arc::new(Schema::new(
        cols.iter().map(Column::field).collect::<Vec<_>>(),
    ));
    let row_bytes: usize = cols.iter().map(|c| 4 * c.width).sum();
    let per_file = (DATA_FILE_MB << 20) / row_bytes.max(1);
    let (mut file, mut file_from, mut from) = (0usize, 0usize, 0usize);
    let mut ep_rows = vec![];
    for (e, ep) in episodes.iter().enumerate() {
        let to = from + ep.actions.len();
        if to - file_from > per_file && from > file_from {
            write_data(out, file, &schema, cols, file_from, from)?;
            (file, file_from) = (file + 1, from);
        }
        ep_rows.push(EpisodeRow {
            episode: e,
            from,
            to,
            file,
        });
        from = to;
    }
    write_data(out, file, &schema, cols, file_from, from)?;
    Ok((ep_rows, file + 1))
}

fn write_data(
    out: &Path,
    file: usize,
    schema: &Arc<Schema>,
    cols: &[Column],
    from: usize,
    to: usize,
) -> Result<()> {
    let path = out.join(chunk_file("data", file));
    let arrays = cols.iter().map(|c| c.array(from, to)).collect();
    let batch =
        RecordBatch::try_new(schema.clone(), arrays).map_err(|e| bad(&path, e.to_string()))?;
    write_file(&path, &parquet_bytes(&batch, &path)?)
}

/// Where an episode's frames are: `from..to` in the dataset, in data file `file`.
struct EpisodeRow {
    episode: usize,
    from: usize,
    to: usize,
    file: usize,
}

/// `meta/episodes/chunk-000/file-000.parquet`: each episode's frame range and where it lives.
fn write_episodes(
    out: &Path,
    rows: &[EpisodeRow],
    videos: &[crate::videos::VideoFeature],
    task: &str,
) -> Result<()> {
    let path = out.join(chunk_file("meta/episodes", 0));
    let int = |f: &dyn Fn(&EpisodeRow) -> usize| -> ArrayRef {
        Arc::new(Int64Array::from(
            rows.iter().map(|r| f(r) as i64).collect::<Vec<_>>(),
        ))
    };
    let mut tasks = ListBuilder::new(StringBuilder::new());
    for _ in rows {
        tasks.values().append_value(task);
        tasks.append(true);
    }
    let mut cols: Vec<(String, ArrayRef)> = vec![
        ("episode_index", int(&|r| r.episode)),
        ("tasks", Arc::new(tasks.finish())),
        ("length", int(&|r| r.to - r.from)),
        ("data/chunk_index", int(&|r| r.file / CHUNK_SIZE)),
        ("data/file_index", int(&|r| r.file % CHUNK_SIZE)),
        ("dataset_from_index", int(&|r| r.from)),
        ("dataset_to_index", int(&|r| r.to)),
        ("meta/episodes/chunk_index", int(&|_| 0)),
        ("meta/episodes/file_index", int(&|_| 0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for v in videos {
        cols.extend(v.columns());
    }
    let batch = RecordBatch::try_from_iter(cols).map_err(|e| bad(&path, e.to_string()))?;
    write_file(&path, &parquet_bytes(&batch, &path)?)
}

/// `meta/tasks.parquet`: `task_index` with the task string as the pandas index (LeRobot reads
/// the task back as the index label, so the pandas metadata is part of the format).
fn write_tasks(out: &Path, task: &str) -> Result<()> {
    let path = out.join("meta/tasks.parquet");
    let pandas = serde_json::json!({
        "index_columns": ["task"],
        "column_indexes": [{"name": null, "field_name": null, "pandas_type": "unicode", "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": null},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": null}
        ],
        "creator": {"library": "reflex", "version": env!("CARGO_PKG_VERSION")},
        "pandas_version": "2.3.3"
    });
    // In the Arrow schema's metadata: pyarrow restores the schema (and pandas its index) from it.
    let schema = Schema::new(vec![
        Field::new("task_index", DataType::Int64, true),
        Field::new("task", DataType::Utf8, true),
    ])
    .with_metadata(std::collections::HashMap::from([(
        "pandas".to_string(),
        pandas.to_string(),
    )]));
    let batch = RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(Int64Array::from(vec![0i64])) as ArrayRef,
            Arc::new(StringArray::from(vec![task])) as ArrayRef,
        ],
    )
    .map_err(|e| bad(&path, e.to_string()))?;
    write_file(&path, &parquet_bytes(&batch, &path)?)
}

/// A LeRobot dataset read for imitation: one (states, actions) pair per episode.
#[derive(Clone, Debug)]
pub struct LeRobotData {
    /// Episodes, in order.
    pub episodes: Vec<EpisodeData>,
    /// `robot_type` of info.json.
    pub robot_type: Option<String>,
    /// Frames per second.
    pub fps: f64,
    /// Size of the state feature.
    pub state_dim: usize,
    /// Size of the action feature.
    pub action_dim: usize,
}

/// The rows of a float vector (or scalar) column as `Vec<f32>` each.
fn float_rows(col: &ArrayRef, key: &str, path: &Path) -> Result<Vec<Vec<f32>>> {
    let flat = |values: &ArrayRef| -> Option<Vec<f32>> {
        if let Some(v) = values.as_primitive_opt::<Float32Type>() {
            Some(v.values().to_vec())
        } else {
            values
                .as_primitive_opt::<Float64Type>()
                .map(|v| v.values().iter().map(|x| *x as f32).collect())
        }
    };
    let unsupported = || {
        bad(
            path,
            format!(
                "column `{key}` is {}; reflex reads float32/float64 vectors (fixed-size or variable lists) and scalars",
                col.data_type()
            ),
        )
    };
    if col.null_count() > 0 {
        return Err(bad(path, format!("column `{key}` has missing values")));
    }
    if let Some(l) = col.as_fixed_size_list_opt() {
        let w = l.value_length() as usize;
        let v = flat(l.values()).ok_or_else(unsupported)?;
        let off = l.offset() * w;
        return Ok((0..l.len())
            .map(|r| v[off + r * w..off + (r + 1) * w].to_vec())
            .collect());
    }
    if let Some(l) = col.as_list_opt::<i32>() {
        let v = flat(l.values()).ok_or_else(unsupported)?;
        let o = l.value_offsets();
        return Ok((0..l.len())
            .map(|r| v[o[r] as usize..o[r + 1] as usize].to_vec())
            .collect());
    }
    if let Some(l) = col.as_list_opt::<i64>() {
        let v = flat(l.values()).ok_or_else(unsupported)?;
        let o = l.value_offsets();
        return Ok((0..l.len())
            .map(|r| v[o[r] as usize..o[r + 1] as usize].to_vec())
            .collect());
    }
    flat(col)
        .map(|v| v.into_iter().map(|x| vec![x]).collect())
        .ok_or_else(unsupported)
}

/// The `*.parquet` files of `root`'s chunk directories (`chunk-*/file-*.parquet`), in name
/// order.
pub(crate) fn chunk_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = vec![];
    for chunk in std::fs::read_dir(root).map_err(|e| DataError::io(root, e))? {
        let chunk = chunk.map_err(|e| DataError::io(root, e))?.path();
        if chunk.is_dir() {
            for f in std::fs::read_dir(&chunk).map_err(|e| DataError::io(&chunk, e))? {
                let f = f.map_err(|e| DataError::io(&chunk, e))?.path();
                if f.extension().is_some_and(|x| x == "parquet") {
                    files.push(f);
                }
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Reads the frames of a LeRobotDataset v3.0 at `dir`: the `state_key` and `action_key`
/// features of every frame, grouped into episodes by `episode_index`, in `index` order.
pub fn read_lerobot(dir: &Path, state_key: &str, action_key: &str) -> Result<LeRobotData> {
    let info_path = dir.join("meta/info.json");
    let text = std::fs::read(&info_path).map_err(|e| DataError::io(&info_path, e))?;
    let info: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(&info_path, e.to_string()))?;
    let version = info["codebase_version"].as_str().unwrap_or("(none)");
    if !version.starts_with("v3.") {
        return Err(bad(
            &info_path,
            format!(
                "is a LeRobot dataset of codebase_version {version}; reflex reads v3.x (convert older ones with LeRobot's convert_dataset_v21_to_v30)"
            ),
        ));
    }
    let features = info["features"].as_object().cloned().unwrap_or_default();
    let size = |key: &str| -> Result<usize> {
        let f = features.get(key).ok_or_else(|| {
            bad(
                &info_path,
                format!(
                    "has no feature `{key}` (features: {}); name the right ones with --state-key / --action-key",
                    features.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let shape: Vec<u64> = f["shape"]
            .as_array()
            .map(|s| s.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        match (f["dtype"].as_str(), shape.as_slice()) {
            (Some("float32" | "float64"), [n]) if *n > 0 => Ok(*n as usize),
            (d, s) => Err(bad(
                &info_path,
                format!(
                    "feature `{key}` is {d:?} of shape {s:?}; reflex trains on 1-D float32/float64 features"
                ),
            )),
        }
    };
    let (state_dim, action_dim) = (size(state_key)?, size(action_key)?);
    let files = chunk_files(&dir.join("data"))?;
    if files.is_empty() {
        return Err(bad(dir, "has no data/chunk-*/file-*.parquet files"));
    }
    let mut rows: Vec<FrameRow> = vec![];
    for f in &files {
        read_frames(
            f,
            (state_key, state_dim),
            (action_key, action_dim),
            &mut rows,
        )?;
    }
    rows.sort_by_key(|r| r.1);
    let mut episodes: Vec<EpisodeData> = vec![];
    let mut current = None;
    for (e, _, s, a) in rows {
        if current != Some(e) {
            episodes.push((vec![], vec![]));
            current = Some(e);
        }
        let ep = episodes.last_mut().expect("pushed above");
        ep.0.push(s);
        ep.1.push(a);
    }
    Ok(LeRobotData {
        episodes,
        robot_type: info["robot_type"].as_str().map(String::from),
        fps: info["fps"].as_f64().unwrap_or(0.0),
        state_dim,
        action_dim,
    })
}

/// One frame of a LeRobot dataset: episode, index, state, action.
type FrameRow = (i64, i64, Vec<f32>, Vec<f32>);

/// Appends the frames of the data file `f` to `rows`, each checked against the widths
/// info.json gives.
fn read_frames(
    f: &Path,
    (state_key, state_dim): (&str, usize),
    (action_key, action_dim): (&str, usize),
    rows: &mut Vec<FrameRow>,
) -> Result<()> {
    let file = std::fs::File::open(f).map_err(|e| DataError::io(f, e))?;
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| bad(f, e.to_string()))?;
    for batch in reader {
        let batch = batch.map_err(|e| bad(f, e.to_string()))?;
        let col = |k: &str| {
            batch
                .column_by_name(k)
                .cloned()
                .ok_or_else(|| bad(f, format!("has no column `{k}`")))
        };
        let ints = |k: &str| -> Result<Vec<i64>> {
            let c = col(k)?;
            c.as_primitive_opt::<Int64Type>()
                .map(|v| v.values().to_vec())
                .ok_or_else(|| bad(f, format!("column `{k}` is {}, not int64", c.data_type())))
        };
        let (s, a) = (
            float_rows(&col(state_key)?, state_key, f)?,
            float_rows(&col(action_key)?, action_key, f)?,
        );
        for (((e, i), s), a) in ints("episode_index")?
            .into_iter()
            .zip(ints("index")?)
            .zip(s)
            .zip(a)
        {
            if s.len() != state_dim || a.len() != action_dim {
                return Err(bad(
                    f,
                    format!(
                        "frame {i}: `{state_key}` has {} values and `{action_key}` {}; info.json says {state_dim} and {action_dim}",
                        s.len(),
                        a.len()
                    ),
                ));
            }
            rows.push((e, i, s, a));
        }
    }
    Ok(())
}

/// A rate as LeRobot writes it in info.json: an integer (its `fps: int`; PyAV, which LeRobot's
/// writer hands it to, refuses a float), a float only when the rate is not whole.
fn fps_value(fps: f64) -> serde_json::Value {
    if fps.fract() == 0.0 && fps > 0.0 && fps < f64::from(u32::MAX) {
        serde_json::json!(fps as u32)
    } else {
        serde_json::json!(fps)
    }
}
