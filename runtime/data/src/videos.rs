//! LeRobotDataset v3.0 video features: each camera's frames of every episode as H.264 MP4 files
//! (`videos/<key>/chunk-NNN/file-NNN.mp4`, many episodes one after another in a file), where each
//! episode sits in them (`videos/<key>/...` columns of the episodes table), their `info.json`
//! entries and `stats.json` figures; and the frames read back for training.
//!
//! The layout follows huggingface/lerobot v0.4.2 (`lerobot_dataset.py`, `utils.py`,
//! `video_utils.py`): a video feature is not a column of the data files; its frame `t` of episode
//! `e` is the video frame at `from_timestamp(e) + t / fps`, which LeRobot's loader finds within
//! 1e-4 s; `from_timestamp` is the sum of the earlier episodes' lengths in the same file over
//! fps, starting at 0 in every file. Video codec `h264` in `yuv420p` is one LeRobot itself
//! writes (`vcodec = "h264"`); reading, reflex also decodes LeRobot's default, AV1.

use crate::demos::Episode;
use crate::{DataError, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use reflex_video::{VideoReader, VideoWriter};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A video file is closed past this size (LeRobot's DEFAULT_VIDEO_FILE_SIZE_IN_MB).
pub const VIDEO_FILE_MB: u64 = 200;
/// ... or past this length: LeRobot compares frame times as float32, which past ~1000 s into a
/// file no longer resolve its 1e-4 s tolerance.
const VIDEO_FILE_S: f64 = 600.0;
/// A key frame every other frame, as LeRobot encodes (`g = 2`): any frame decodes fast.
const GOP: u32 = 2;
/// Files per chunk directory (LeRobot's DEFAULT_CHUNK_SIZE).
const CHUNK_SIZE: usize = 1000;
/// Frame times within this of where they should be belong to the frame (LeRobot's tolerance_s).
const TOLERANCE_S: f64 = 1e-4;

fn bad(path: &Path, message: impl Into<String>) -> DataError {
    DataError::invalid(format!("dataset `{}`", path.display()), message.into())
}

fn video_err(e: reflex_video::VideoError) -> DataError {
    DataError::invalid(format!("video `{}`", e.path), e.message)
}

/// The feature key of a camera's frames (LeRobot's naming: `observation.images.<camera>`).
pub fn feature_key(camera: &str) -> String {
    format!("observation.images.{camera}")
}

/// Where one episode's frames of one camera are.
#[derive(Clone, Debug, PartialEq)]
pub struct VideoRow {
    /// Chunk directory.
    pub chunk: usize,
    /// File within the chunk.
    pub file: usize,
    /// Time of the episode's first frame in the file, s.
    pub from_s: f64,
    /// Time just after its last frame, s.
    pub to_s: f64,
}

/// One camera's video feature as written.
#[derive(Clone, Debug)]
pub struct VideoFeature {
    /// Camera name.
    pub camera: String,
    /// Feature key.
    pub key: String,
    /// Frame size, pixels.
    pub width: u32,
    /// Frame size, pixels.
    pub height: u32,
    /// Frames a second.
    pub fps: u32,
    /// Per episode, where its frames are.
    pub rows: Vec<VideoRow>,
    /// Files written.
    pub files: usize,
    /// Bytes written.
    pub bytes: u64,
    /// stats.json's entry.
    pub stats: serde_json::Value,
}

impl VideoFeature {
    /// The feature's entry in info.json (LeRobot's `hw_to_dataset_features` and
    /// `get_video_info`: shape height, width, channels).
    pub fn info(&self) -> serde_json::Value {
        serde_json::json!({
            "dtype": "video",
            "shape": [self.height, self.width, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": self.height,
                "video.width": self.width,
                "video.codec": reflex_video::CODEC,
                "video.pix_fmt": reflex_video::PIX_FMT,
                "video.is_depth_map": false,
                "video.fps": self.fps,
                "video.channels": 3,
                "has_audio": false,
            },
        })
    }

    /// The episodes table's columns for this feature.
    pub fn columns(&self) -> Vec<(String, ArrayRef)> {
        let k = &self.key;
        let int = |f: &dyn Fn(&VideoRow) -> usize| -> ArrayRef {
            Arc::new(Int64Array::from(
                self.rows.iter().map(|r| f(r) as i64).collect::<Vec<_>>(),
            ))
        };
        let float = |f: &dyn Fn(&VideoRow) -> f64| -> ArrayRef {
            Arc::new(Float64Array::from(
                self.rows.iter().map(f).collect::<Vec<_>>(),
            ))
        };
        vec![
            (format!("videos/{k}/chunk_index"), int(&|r| r.chunk)),
            (format!("videos/{k}/file_index"), int(&|r| r.file)),
            (format!("videos/{k}/from_timestamp"), float(&|r| r.from_s)),
            (format!("videos/{k}/to_timestamp"), float(&|r| r.to_s)),
        ]
    }
}

/// `videos/<key>/chunk-NNN/file-NNN.mp4` (LeRobot's `video_path` template filled in).
fn video_file(key: &str, chunk: usize, file: usize) -> String {
    format!("videos/{key}/chunk-{chunk:03}/file-{file:03}.mp4")
}

/// Per-channel histograms of the exported frames: stats.json's image statistics.
struct Histogram {
    counts: [[u64; 256]; 3],
    frames: u64,
}

impl Histogram {
    fn add(&mut self, rgb: &[u8]) {
        for px in rgb.chunks_exact(3) {
            for (counts, v) in self.counts.iter_mut().zip(px) {
                counts[*v as usize] += 1;
            }
        }
        self.frames += 1;
    }

    /// min, max, mean, std and quantiles per channel on LeRobot's scale (0..1, shape [3, 1, 1]),
    /// and `count`, the frames they come from.
    fn stats(&self) -> serde_json::Value {
        let per_channel = |f: &dyn Fn(&[u64; 256], u64) -> f64| -> serde_json::Value {
            serde_json::Value::Array(
                self.counts
                    .iter()
                    .map(|h| {
                        let n = h.iter().sum::<u64>().max(1);
                        serde_json::json!([[f(h, n)]])
                    })
                    .collect(),
            )
        };
        let mean = |h: &[u64; 256], n: u64| {
            h.iter()
                .enumerate()
                .map(|(v, c)| v as f64 * *c as f64)
                .sum::<f64>()
                / n as f64
        };
        let quantile = |q: f64| {
            move |h: &[u64; 256], n: u64| {
                let want = (q * n as f64).ceil().max(1.0) as u64;
                let mut seen = 0;
                for (v, c) in h.iter().enumerate() {
                    seen += c;
                    if seen >= want {
                        return v as f64 / 255.0;
                    }
                }
                1.0
            }
        };
        let mut out = serde_json::Map::new();
        out.insert(
            "min".into(),
            per_channel(&|h, _| h.iter().position(|c| *c > 0).unwrap_or(0) as f64 / 255.0),
        );
        out.insert(
            "max".into(),
            per_channel(&|h, _| h.iter().rposition(|c| *c > 0).unwrap_or(0) as f64 / 255.0),
        );
        out.insert("mean".into(), per_channel(&|h, n| mean(h, n) / 255.0));
        out.insert(
            "std".into(),
            per_channel(&|h, n| {
                let m = mean(h, n);
                let var = h
                    .iter()
                    .enumerate()
                    .map(|(v, c)| (v as f64 - m).powi(2) * *c as f64)
                    .sum::<f64>()
                    / n as f64;
                var.sqrt() / 255.0
            }),
        );
        out.insert("count".into(), serde_json::json!([self.frames]));
        for (q, name) in [
            (0.01, "q01"),
            (0.10, "q10"),
            (0.50, "q50"),
            (0.90, "q90"),
            (0.99, "q99"),
        ] {
            out.insert(name.into(), per_channel(&quantile(q)));
        }
        out.into()
    }
}

/// Writes every camera recorded with `episodes` as a video feature under `out` (none recorded:
/// no videos). `files` are the episodes' files, for messages. Frame `t` of an episode is the
/// frame of its observation `t` (the one its action `t` was taken on).
pub fn write_videos(
    out: &Path,
    episodes: &[Episode],
    files: &[PathBuf],
    fps: f64,
) -> Result<Vec<VideoFeature>> {
    let Some(first) = episodes.first() else {
        return Ok(vec![]);
    };
    let cameras: Vec<(String, u32, u32)> = first
        .cameras
        .iter()
        .map(|s| (s.camera.clone(), s.width, s.height))
        .collect();
    for (ep, file) in episodes.iter().zip(files) {
        let names: Vec<&str> = ep.cameras.iter().map(|s| s.camera.as_str()).collect();
        let want: Vec<&str> = cameras.iter().map(|c| c.0.as_str()).collect();
        if names != want {
            return Err(bad(
                file,
                format!(
                    "episode {} has frames of cameras {names:?}, the first episode of {want:?}; \
                     export episodes recorded with the same cameras together",
                    ep.index
                ),
            ));
        }
        for (s, (_, w, h)) in ep.cameras.iter().zip(&cameras) {
            if (s.width, s.height) != (*w, *h) {
                return Err(bad(
                    file,
                    format!(
                        "episode {}: camera `{}` frames are {}x{}, the first episode's {w}x{h}",
                        ep.index, s.camera, s.width, s.height
                    ),
                ));
            }
        }
        ep.check_cameras()
            .map_err(|m| bad(file, format!("episode {}: {m}", ep.index)))?;
    }
    if cameras.is_empty() {
        return Ok(vec![]);
    }
    if !(fps >= 1.0 && fps.fract() == 0.0 && fps <= 1000.0) {
        return Err(bad(
            out,
            format!(
                "the robot runs at {fps} Hz; LeRobot's videos need a whole number of frames a \
                 second (1 to 1000)"
            ),
        ));
    }
    let fps = fps as u32;
    cameras
        .iter()
        .enumerate()
        .map(|(c, (camera, width, height))| {
            write_camera(out, episodes, c, camera, *width, *height, fps)
        })
        .collect()
}

/// One camera's frames of every episode, in files of at most [`VIDEO_FILE_MB`] and
/// [`VIDEO_FILE_S`].
fn write_camera(
    out: &Path,
    episodes: &[Episode],
    c: usize,
    camera: &str,
    width: u32,
    height: u32,
    fps: u32,
) -> Result<VideoFeature> {
    let key = feature_key(camera);
    let open = |index: usize| -> Result<VideoWriter> {
        let path = out.join(video_file(&key, index / CHUNK_SIZE, index % CHUNK_SIZE));
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).map_err(|e| DataError::io(d, e))?;
        }
        VideoWriter::create(&path, width, height, fps, GOP).map_err(video_err)
    };
    let (mut index, mut bytes) = (0usize, 0u64);
    let mut writer = open(index)?;
    let mut rows = Vec::with_capacity(episodes.len());
    let mut hist = Histogram {
        counts: [[0; 256]; 3],
        frames: 0,
    };
    for ep in episodes {
        let full = writer.bytes() >= VIDEO_FILE_MB << 20
            || writer.frames() as f64 / fps as f64 >= VIDEO_FILE_S;
        if full {
            bytes += writer.finish().map_err(video_err)?.bytes;
            index += 1;
            writer = open(index)?;
        }
        let from = writer.frames();
        // One frame per row; a run that kept frames at some steps only holds each until the next.
        for i in 0..ep.actions.len() {
            let frame = &ep.cameras[c].frames[ep.frame_at(i)];
            writer.push(frame).map_err(video_err)?;
            hist.add(frame);
        }
        rows.push(VideoRow {
            chunk: index / CHUNK_SIZE,
            file: index % CHUNK_SIZE,
            from_s: from as f64 / fps as f64,
            to_s: writer.frames() as f64 / fps as f64,
        });
    }
    if writer.frames() > 0 {
        bytes += writer.finish().map_err(video_err)?.bytes;
    }
    Ok(VideoFeature {
        camera: camera.into(),
        key,
        width,
        height,
        fps,
        rows,
        files: index + 1,
        bytes,
        stats: hist.stats(),
    })
}

/// The episodes table (every `meta/episodes/chunk-*/file-*.parquet`, in name order).
fn episode_tables(dir: &Path) -> Result<Vec<(PathBuf, RecordBatch)>> {
    let files = crate::dataset::chunk_files(&dir.join("meta/episodes"))?;
    let mut out = vec![];
    for f in files {
        let file = std::fs::File::open(&f).map_err(|e| DataError::io(&f, e))?;
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| bad(&f, e.to_string()))?;
        for batch in reader {
            let batch = batch.map_err(|e| bad(&f, e.to_string()))?;
            out.push((f.clone(), batch));
        }
    }
    if out.is_empty() {
        return Err(bad(dir, "has no meta/episodes/chunk-*/file-*.parquet"));
    }
    Ok(out)
}

/// One episode's place in a video feature, from the episodes table.
struct Placed {
    episode: i64,
    length: usize,
    row: VideoRow,
}

fn placements(dir: &Path, key: &str) -> Result<Vec<Placed>> {
    let mut out = vec![];
    for (f, batch) in episode_tables(dir)? {
        let col = |k: &str| {
            batch.column_by_name(k).cloned().ok_or_else(|| {
                bad(
                    &f,
                    format!(
                        "has no column `{k}`: the dataset does not say where `{key}` frames are"
                    ),
                )
            })
        };
        let ints = |k: &str| -> Result<Vec<i64>> {
            let c = col(k)?;
            c.as_primitive_opt::<Int64Type>()
                .map(|v| v.values().to_vec())
                .ok_or_else(|| bad(&f, format!("column `{k}` is {}, not int64", c.data_type())))
        };
        let floats = |k: &str| -> Result<Vec<f64>> {
            let c = col(k)?;
            c.as_primitive_opt::<Float64Type>()
                .map(|v| v.values().to_vec())
                .ok_or_else(|| {
                    bad(
                        &f,
                        format!("column `{k}` is {}, not float64", c.data_type()),
                    )
                })
        };
        let (e, len) = (ints("episode_index")?, ints("length")?);
        let (chunk, file) = (
            ints(&format!("videos/{key}/chunk_index"))?,
            ints(&format!("videos/{key}/file_index"))?,
        );
        let (from, to) = (
            floats(&format!("videos/{key}/from_timestamp"))?,
            floats(&format!("videos/{key}/to_timestamp"))?,
        );
        for i in 0..e.len() {
            if len[i] < 0 || chunk[i] < 0 || file[i] < 0 || !(from[i] >= 0.0 && to[i] >= from[i]) {
                return Err(bad(
                    &f,
                    format!("episode {}: a negative length, index or time", e[i]),
                ));
            }
            out.push(Placed {
                episode: e[i],
                length: len[i] as usize,
                row: VideoRow {
                    chunk: chunk[i] as usize,
                    file: file[i] as usize,
                    from_s: from[i],
                    to_s: to[i],
                },
            });
        }
    }
    out.sort_by_key(|p| p.episode);
    Ok(out)
}

/// The video feature's key for `camera` in the dataset at `dir`: `observation.images.<camera>`,
/// or `camera` itself when that is a video feature; the error lists the video features there are.
pub fn video_key(
    features: &serde_json::Map<String, serde_json::Value>,
    camera: &str,
    info: &Path,
) -> Result<String> {
    let is_video = |k: &str| features.get(k).is_some_and(|f| f["dtype"] == "video");
    for k in [feature_key(camera), camera.to_string()] {
        if is_video(&k) {
            return Ok(k);
        }
    }
    let videos: Vec<&String> = features.keys().filter(|k| is_video(k)).collect();
    Err(bad(
        info,
        format!(
            "has no video feature for camera `{camera}` (video features: {videos:?}); name one with --camera"
        ),
    ))
}

/// Decodes the frames of video feature `key` for the first `episodes` episodes of the dataset at
/// `dir`, in order, handing each to `each(episode, rgb, width, height)`; checks every episode
/// gets exactly its `length` frames.
pub fn read_video_frames(
    dir: &Path,
    key: &str,
    episodes: usize,
    fps: f64,
    template: &str,
    mut each: impl FnMut(usize, &[u8], u32, u32) -> Result<()>,
) -> Result<()> {
    let placed = placements(dir, key)?;
    let mut current: Option<((usize, usize), VideoReader, f64)> = None;
    let mut rgb = vec![];
    for (e, p) in placed.iter().take(episodes).enumerate() {
        if p.episode != e as i64 {
            return Err(bad(
                dir,
                format!(
                    "the episodes table has no episode {e} (episodes must be numbered 0, 1, ...)"
                ),
            ));
        }
        let at = (p.row.chunk, p.row.file);
        let path = dir.join(
            template
                .replace("{video_key}", key)
                .replace("{chunk_index:03d}", &format!("{:03}", p.row.chunk))
                .replace("{file_index:03d}", &format!("{:03}", p.row.file)),
        );
        // Frames are read on from where the previous episode stopped when it shares the file
        // and comes later in it; otherwise the file is opened afresh.
        let reuse =
            matches!(&current, Some((k, _, t)) if *k == at && *t <= p.row.from_s + TOLERANCE_S);
        if !reuse {
            let r = VideoReader::open(&path).map_err(video_err)?;
            let (w, h) = r.size();
            rgb.resize(w as usize * h as usize * 3, 0);
            current = Some((at, r, 0.0));
        }
        let (_, reader, next_t) = current.as_mut().expect("set above");
        let (w, h) = reader.size();
        let half = 0.5 / fps;
        let mut got = 0;
        while got < p.length {
            let Some(t) = reader.next_frame(&mut rgb).map_err(video_err)? else {
                break;
            };
            *next_t = t + half;
            if t < p.row.from_s - half {
                continue;
            }
            let want = p.row.from_s + got as f64 / fps;
            if (t - want).abs() > TOLERANCE_S.max(half) {
                return Err(bad(
                    &path,
                    format!(
                        "episode {e}: frame {got} is at {t:.4} s, it should be at {want:.4} s \
                         (from_timestamp + frame / fps)"
                    ),
                ));
            }
            each(e, &rgb, w, h)?;
            got += 1;
        }
        if got != p.length {
            return Err(bad(
                &path,
                format!(
                    "episode {e}: {got} frames of `{key}` from {:.4} s, the episode has {}",
                    p.row.from_s, p.length
                ),
            ));
        }
    }
    if placed.len() < episodes {
        return Err(bad(
            dir,
            format!(
                "the episodes table places {} episodes in `{key}`, {episodes} were asked for",
                placed.len()
            ),
        ));
    }
    Ok(())
}

/// Decodes camera `camera`'s frames (feature `observation.images.<camera>`, or `camera` itself)
/// of the first `episodes` episodes of the LeRobot dataset at `dir`, in order, handing each to
/// `each(episode, rgb, width, height)`; returns the feature's key.
pub fn read_camera(
    dir: &Path,
    camera: &str,
    episodes: usize,
    each: impl FnMut(usize, &[u8], u32, u32) -> Result<()>,
) -> Result<String> {
    let info_path = dir.join("meta/info.json");
    let text = std::fs::read(&info_path).map_err(|e| DataError::io(&info_path, e))?;
    let info: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(&info_path, e.to_string()))?;
    let features = info["features"].as_object().cloned().unwrap_or_default();
    let key = video_key(&features, camera, &info_path)?;
    let template = info["video_path"].as_str().ok_or_else(|| {
        bad(
            &info_path,
            "has video features but no `video_path` template",
        )
    })?;
    let fps = info["fps"]
        .as_f64()
        .filter(|f| *f > 0.0)
        .ok_or_else(|| bad(&info_path, "has no positive `fps`"))?;
    read_video_frames(dir, &key, episodes, fps, template, each)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demos::CameraStream;

    /// An episode of `steps` steps whose camera frames are flat `colour`, brighter by 8 levels a
    /// frame.
    fn episode(index: u64, steps: usize, colour: [u8; 3]) -> Episode {
        let mut cam = CameraStream::new("front", 32, 24);
        for t in 0..=steps {
            let px = colour.map(|c| c.saturating_add(8 * t as u8));
            cam.push(&px.repeat(32 * 24));
        }
        Episode {
            index,
            observations: vec![vec![0.0]; steps + 1],
            actions: vec![vec![0.0]; steps],
            rewards: vec![0.0; steps],
            cameras: vec![cam],
            ..Default::default()
        }
    }

    #[test]
    fn episodes_share_a_file_and_each_gets_back_its_own_frames() {
        let dir = tempfile::tempdir().unwrap();
        let eps = [
            episode(0, 5, [40, 60, 80]),
            episode(1, 3, [150, 30, 30]),
            episode(2, 4, [20, 140, 40]),
        ];
        let files = vec![PathBuf::from("ep"); 3];
        let v = write_videos(dir.path(), &eps, &files, 20.0).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].files, 1);
        // Each episode starts where the one before ended (frames over fps), in the one file.
        let from: Vec<f64> = v[0].rows.iter().map(|r| r.from_s).collect();
        assert_eq!(from, [0.0, 0.25, 0.4]);
        assert_eq!(v[0].rows[2].to_s, 0.6);
        let stats = &v[0].stats;
        assert_eq!(stats["count"], serde_json::json!([12]));
        // The episodes table and info.json as LeRobot reads them.
        let mut cols: Vec<(String, ArrayRef)> = vec![
            (
                "episode_index".into(),
                Arc::new(Int64Array::from(vec![0i64, 1, 2])) as ArrayRef,
            ),
            (
                "length".into(),
                Arc::new(Int64Array::from(vec![5i64, 3, 4])) as ArrayRef,
            ),
        ];
        cols.extend(v[0].columns());
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let path = dir.path().join("meta/episodes/chunk-000/file-000.parquet");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let info = serde_json::json!({
            "fps": 20,
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": {"observation.images.front": v[0].info()},
        });
        std::fs::write(dir.path().join("meta/info.json"), info.to_string()).unwrap();
        // Read back by reflex's own decoder: every frame in its episode, near its colour.
        let mut seen: Vec<(usize, [f64; 3])> = vec![];
        let key = read_camera(dir.path(), "front", 3, |e, rgb, w, h| {
            assert_eq!((w, h), (32, 24));
            let mut mean = [0.0; 3];
            for px in rgb.chunks_exact(3) {
                for c in 0..3 {
                    mean[c] += px[c] as f64 / (32.0 * 24.0);
                }
            }
            seen.push((e, mean));
            Ok(())
        })
        .unwrap();
        assert_eq!(key, "observation.images.front");
        assert_eq!(seen.len(), 12);
        let mut k = 0;
        for ep in &eps {
            for t in 0..ep.actions.len() {
                let want = &ep.cameras[0].frames[t][..3];
                let (e, got) = seen[k];
                assert_eq!(e as u64, ep.index);
                for c in 0..3 {
                    assert!(
                        (got[c] - want[c] as f64).abs() < 3.0,
                        "episode {e} frame {t}: {got:?} vs {want:?}"
                    );
                }
                k += 1;
            }
        }
        // Only the first two episodes when asked for two; a camera there is no video of is
        // named with the ones there are.
        let mut n = 0;
        read_camera(dir.path(), "front", 2, |_, _, _, _| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 8);
        let e = read_camera(dir.path(), "side", 3, |_, _, _, _| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`side`") && e.contains("observation.images.front"),
            "{e}"
        );
    }

    #[test]
    fn episodes_recorded_with_other_cameras_or_rates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut other = episode(1, 3, [1, 2, 3]);
        other.cameras[0].camera = "wrist".into();
        let files = vec![PathBuf::from("ep-0"), PathBuf::from("ep-1")];
        let e = write_videos(dir.path(), &[episode(0, 2, [0; 3]), other], &files, 20.0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("ep-1") && e.contains("wrist"), "{e}");
        let e = write_videos(dir.path(), &[episode(0, 2, [0; 3])], &files[..1], 29.97)
            .unwrap_err()
            .to_string();
        assert!(e.contains("29.97") && e.contains("whole number"), "{e}");
    }
}
