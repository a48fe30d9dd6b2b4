"""Checks a LeRobotDataset v3.0 directory the way LeRobot's loader reads it, without LeRobot itself
(it needs torch): every file `LeRobotDataset(repo_id, root=DIR)` opens, their schemas, and the
frames loaded with Hugging Face `datasets` using the features LeRobot derives from info.json
(lerobot/datasets/utils.py and feature_utils.py: shape [1] -> Value, 1-D -> Sequence(length=N)).

Video features are checked as LeRobot 0.4's pyav backend reads them (video_utils.py): not columns
of the data files; each episode's `videos/<key>/...` columns name a file from `video_path`; the
file decodes with PyAV (the pin range LeRobot 0.4 uses) at a constant rate, frame j at j/fps;
every row's frame is the decoded frame nearest `from_timestamp + timestamp`, within LeRobot's
1e-4 s tolerance; codec, pixel format, size and rate agree with info.json.

usage: check_lerobot_dataset.py DIR [--demos DEMOS]
With --demos (the reflex episodes the dataset was exported from), every decoded frame is compared
with the recorded one: `videos` reports the largest mean absolute difference of a frame, in levels.
prints JSON: {"episodes": ..., "frames": ..., "features": [...], "task": "...", ...}; exits 1 with
the reason when something LeRobot relies on is missing or wrong.
"""
import glob
import json
import os
import sys

import datasets
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

root = sys.argv[1]
demos = sys.argv[sys.argv.index("--demos") + 1] if "--demos" in sys.argv else None


def fail(msg):
    print(f"not a loadable LeRobot v3.0 dataset: {msg}", file=sys.stderr)
    sys.exit(1)


def need(cond, msg):
    if not cond:
        fail(msg)


info = json.load(open(os.path.join(root, "meta/info.json")))
# LeRobot 0.4.x indexes every one of these keys directly.
for k in ["codebase_version", "robot_type", "total_episodes", "total_frames", "total_tasks", "chunks_size",
          "data_files_size_in_mb", "video_files_size_in_mb", "fps", "splits", "data_path", "video_path", "features"]:
    need(k in info, f"info.json has no `{k}`")
need(info["codebase_version"] == "v3.0", f"codebase_version {info['codebase_version']}")
feats = info["features"]
videos = {k: v for k, v in feats.items() if v["dtype"] == "video"}
columns = {k: v for k, v in feats.items() if v["dtype"] != "video"}
for k, dt in [("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")]:
    need(k in feats and feats[k]["dtype"] == dt and feats[k]["shape"] == [1], f"default feature {k}: {feats.get(k)}")

# The data files, as io_utils.load_nested_dataset reads them.
files = sorted(glob.glob(os.path.join(root, "data/*/*.parquet")))
need(files, "no data files")
for f in files:
    rel = os.path.relpath(f, root)
    need(rel.startswith("data/chunk-") and "/file-" in rel, f"data file name {rel}")
    schema = pq.read_schema(f)
    need(set(schema.names) == set(columns), f"{rel}: columns {schema.names} vs non-video features {list(columns)}")
    for name in schema.names:
        t, ft = schema.field(name).type, columns[name]
        if ft["shape"] == [1]:
            need(not pa.types.is_list(t) and not pa.types.is_fixed_size_list(t), f"{name}: shape [1] must be a scalar, is {t}")
        else:
            need(pa.types.is_fixed_size_list(t) and t.list_size == ft["shape"][0], f"{name}: {t} for shape {ft['shape']}")


def hf_feature(ft):
    dtype = ft["dtype"]
    if ft["shape"] == [1]:
        return datasets.Value(dtype)
    return datasets.Sequence(length=ft["shape"][0], feature=datasets.Value(dtype))


hf = datasets.Dataset.from_parquet(files, features=datasets.Features({k: hf_feature(v) for k, v in columns.items()}))
n = len(hf)
need(n == info["total_frames"], f"{n} frames, info.json says {info['total_frames']}")
index = hf["index"]
need(list(index) == list(range(n)), "the index column is not 0..N-1 in file order")
ep_idx = hf["episode_index"]
need(set(ep_idx) == set(range(info["total_episodes"])), "episode_index does not cover 0..total_episodes-1")

# Episodes metadata (dataset_reader uses the frame ranges).
episodes = pq.read_table(sorted(glob.glob(os.path.join(root, "meta/episodes/*/*.parquet")))[0]).to_pydict()
for k in ["episode_index", "tasks", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
          "dataset_to_index", "meta/episodes/chunk_index", "meta/episodes/file_index"]:
    need(k in episodes, f"episodes metadata has no `{k}`")
frame_idx = hf["frame_index"]
for e, lo, hi, length in zip(episodes["episode_index"], episodes["dataset_from_index"], episodes["dataset_to_index"], episodes["length"]):
    need(hi - lo == length, f"episode {e}: range {lo}..{hi} and length {length}")
    need(all(x == e for x in ep_idx[lo:hi]), f"episode {e}: rows {lo}..{hi} belong to other episodes")
    need(list(frame_idx[lo:hi]) == list(range(length)), f"episode {e}: frame_index is not 0..length-1")
need(sum(episodes["length"]) == n, "episode lengths do not add up to the frames")

# Tasks: LeRobot reads the task back as the pandas index label.
tasks = pd.read_parquet(os.path.join(root, "meta/tasks.parquet"))
need(tasks.index.name == "task" and "task_index" in tasks.columns, f"tasks.parquet: index {tasks.index.name}, columns {list(tasks.columns)}")
task = tasks.iloc[hf["task_index"][0]].name
need(isinstance(task, str), f"the task comes back as {type(task)}")

stats = json.load(open(os.path.join(root, "meta/stats.json")))
for name, ft in feats.items():
    if ft["dtype"] in ("float32", "int64"):
        need(name in stats, f"stats.json has no `{name}`")
        for s in ["min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"]:
            need(s in stats[name], f"stats.json `{name}` has no `{s}`")
            want = 1 if s == "count" else ft["shape"][0]
            need(len(stats[name][s]) == want, f"stats.json `{name}`.{s}: {len(stats[name][s])} values")

video_report = {}
if videos:
    import av
    import numpy as np

    need(info["video_path"], "video features but no video_path")
    fps = info["fps"]
    recorded = None
    if demos:
        import msgpack
        manifest = json.load(open(os.path.join(demos, "manifest.json")))
        recorded = [msgpack.unpackb(open(os.path.join(demos, e["file"]), "rb").read(), raw=False) for e in manifest["episodes"]]
    ts_all = hf["timestamp"]
    for key, ft in videos.items():
        need(ft["names"] == ["height", "width", "channels"], f"{key}: names {ft['names']}")
        h, w, c = ft["shape"]
        vi = ft["info"]
        for k in ["video.height", "video.width", "video.codec", "video.pix_fmt", "video.is_depth_map", "video.fps", "video.channels", "has_audio"]:
            need(k in vi, f"{key}: info has no `{k}`")
        need(key in stats and all(len(stats[key][s]) == 3 and len(stats[key][s][0]) == 1 for s in ["min", "max", "mean", "std", "q50"]), f"stats.json `{key}`: not per channel [3,1,1]")
        need(all(0.0 <= stats[key]["min"][i][0][0] <= stats[key]["max"][i][0][0] <= 1.0 for i in range(3)), f"stats.json `{key}`: not on a 0..1 scale")
        decoded = {}  # (chunk, file) -> (times, frames)
        worst, nframes = 0.0, 0
        for e in range(info["total_episodes"]):
            chunk, fidx = episodes[f"videos/{key}/chunk_index"][e], episodes[f"videos/{key}/file_index"][e]
            frm = episodes[f"videos/{key}/from_timestamp"][e]
            to = episodes[f"videos/{key}/to_timestamp"][e]
            if (chunk, fidx) not in decoded:
                path = os.path.join(root, info["video_path"].format(video_key=key, chunk_index=chunk, file_index=fidx))
                need(os.path.isfile(path), f"{key}: episode {e}'s video {path} does not exist")
                with av.open(path) as container:
                    stream = container.streams.video[0]
                    # LeRobot's get_video_info writes the codec's canonical name ("h264", "av1").
                    codec = stream.codec_context.codec.canonical_name
                    need(codec == vi["video.codec"], f"{path}: codec {codec}, info says {vi['video.codec']}")
                    need(stream.codec_context.pix_fmt == vi["video.pix_fmt"], f"{path}: pix_fmt {stream.codec_context.pix_fmt}")
                    need((stream.width, stream.height) == (w, h), f"{path}: {stream.width}x{stream.height}, shape says {w}x{h}")
                    need(int(stream.base_rate) == vi["video.fps"] == fps, f"{path}: rate {stream.base_rate}, info {vi['video.fps']}, fps {fps}")
                    times, frames = [], []
                    for frame in container.decode(stream):
                        times.append(float(frame.pts * stream.time_base))
                        frames.append(frame.to_ndarray(format="rgb24"))
                need(all(abs(t - j / fps) < 1e-6 for j, t in enumerate(times)), f"{path}: frame times are not j/fps: {times[:5]}...")
                decoded[(chunk, fidx)] = (np.array(times), frames)
            times, frames = decoded[(chunk, fidx)]
            lo, hi = episodes["dataset_from_index"][e], episodes["dataset_to_index"][e]
            need(abs((to - frm) - (hi - lo) / fps) < 1e-6, f"{key}: episode {e} spans {frm}..{to} s for {hi - lo} frames")
            for t, row in enumerate(range(lo, hi)):
                query = frm + ts_all[row]
                j = int(np.argmin(np.abs(times - query)))
                need(abs(times[j] - query) < 1e-4, f"{key}: episode {e} frame {t}: nearest decoded frame at {times[j]} s, query {query} s (tolerance 1e-4)")
                need(frames[j].shape == (h, w, c), f"{key}: frame shape {frames[j].shape}")
                if recorded is not None:
                    cam = key.split(".")[-1]
                    stream_rec = next(s for s in recorded[e]["cameras"] if s["camera"] == cam)
                    want = np.frombuffer(stream_rec["frames"][t], dtype=np.uint8).reshape(h, w, 3)
                    worst = max(worst, float(np.abs(frames[j].astype(np.int32) - want.astype(np.int32)).mean()))
                nframes += 1
        total = sum(len(v[1]) for v in decoded.values())
        need(total == n, f"{key}: {total} frames in its videos for {n} rows")
        video_report[key] = {"frames": nframes, "files": len(decoded), "codec": vi["video.codec"], "shape": ft["shape"],
                             "worst_mean_abs_diff": worst if recorded is not None else None}

print(json.dumps({
    "videos": video_report,
    "episodes": info["total_episodes"],
    "frames": n,
    "fps": info["fps"],
    "robot_type": info["robot_type"],
    "features": sorted(feats),
    "task": task,
    "people": int(sum(hf["reflex.person"])) if "reflex.person" in feats else None,
    "first_state": hf[0]["observation.state"],
}))
# The verdict is out. Leave without the interpreter's teardown: in one `make test` run
# (2026-11-25) a library's native threads aborted the process there ("terminate called without an
# active exception") after this report was printed, which failed a correct dataset; the same test
# passed on its own right after. Failures above still exit 1 through `fail`.
sys.stdout.flush()
os._exit(0)
