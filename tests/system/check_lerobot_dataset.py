"""Checks a LeRobotDataset v3.0 directory the way LeRobot's loader reads it, without LeRobot itself
(it needs torch): every file `LeRobotDataset(repo_id, root=DIR)` opens, their schemas, and the
frames loaded with Hugging Face `datasets` using the features LeRobot derives from info.json
(lerobot/datasets/utils.py and feature_utils.py: shape [1] -> Value, 1-D -> Sequence(length=N)).

usage: check_lerobot_dataset.py DIR
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
for k, dt in [("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")]:
    need(k in feats and feats[k]["dtype"] == dt and feats[k]["shape"] == [1], f"default feature {k}: {feats.get(k)}")

# The data files, as io_utils.load_nested_dataset reads them.
files = sorted(glob.glob(os.path.join(root, "data/*/*.parquet")))
need(files, "no data files")
for f in files:
    rel = os.path.relpath(f, root)
    need(rel.startswith("data/chunk-") and "/file-" in rel, f"data file name {rel}")
    schema = pq.read_schema(f)
    need(set(schema.names) == set(feats), f"{rel}: columns {schema.names} vs features {list(feats)}")
    for name in schema.names:
        t, ft = schema.field(name).type, feats[name]
        if ft["shape"] == [1]:
            need(not pa.types.is_list(t) and not pa.types.is_fixed_size_list(t), f"{name}: shape [1] must be a scalar, is {t}")
        else:
            need(pa.types.is_fixed_size_list(t) and t.list_size == ft["shape"][0], f"{name}: {t} for shape {ft['shape']}")


def hf_feature(ft):
    dtype = ft["dtype"]
    if ft["shape"] == [1]:
        return datasets.Value(dtype)
    return datasets.Sequence(length=ft["shape"][0], feature=datasets.Value(dtype))


hf = datasets.Dataset.from_parquet(files, features=datasets.Features({k: hf_feature(v) for k, v in feats.items()}))
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

print(json.dumps({
    "episodes": info["total_episodes"],
    "frames": n,
    "fps": info["fps"],
    "robot_type": info["robot_type"],
    "features": sorted(feats),
    "task": task,
    "people": int(sum(hf["reflex.person"])) if "reflex.person" in feats else None,
    "first_state": hf[0]["observation.state"],
}))
