"""The path a LeRobot user takes through reflex, run end to end (`make lerobot-path`).

Every step is the real program a user runs, each in its own process:

1. `reflex sim demos --cameras`: the simulator's scripted expert on `pick`, with both cameras.
2. `reflex dataset export`: a LeRobotDataset v3.0 with H.264 videos.
3. LeRobot's own `LeRobotDataset` opens it (its pyav video backend) and every frame, state and
   action it returns is compared with the episodes reflex recorded.
4. `lerobot-train` trains ACT on it, on the CPU, from scratch (no pretrained backbone: nothing is
   downloaded).
5. `reflex policy import lerobot` turns the checkpoint into an ONNX model and its spec.
6. `reflex run` drives the simulator with it (the cameras on): the imported ACT's success alone.
7. `reflex demo --model` refines it with the residual learner and a simulated person, and
   measures the base alone and the refined policy on the same held-out episodes.

And the other way:

8. LeRobot's own writer (`LeRobotDataset.create`, `add_frame`, `save_episode`, `finalize`) copies
   the loaded dataset twice, with its default AV1 (libsvtav1) and with H.264 (libx264), and
   `reflex bc train --dataset --camera front` trains on each (reflex decodes both).

It prints one JSON object with every figure (`--json-out` writes it too) and exits 1 at the first
step that fails, naming it. The sizes are small by default so the whole path runs in minutes;
`--demos`, `--train-steps` and `--demo-episodes` make the measured run of the lift (docs/
bring-your-own-policy.md).

    .venv-lerobot/bin/python policies/import/user_path.py --reflex $CARGO_TARGET_DIR/release/reflex
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def sh(cmd, **kw):
    print("$ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def step(name):
    print(f"\n== {name}", file=sys.stderr, flush=True)
    return time.monotonic()


def fail(msg):
    print(f"lerobot path: {msg}", file=sys.stderr)
    sys.exit(1)


def reflex_episodes(demos):
    """The episodes reflex recorded (manifest.json and one MessagePack file each): states, actions
    and camera frames, as recorded."""
    import msgpack

    m = json.loads((demos / "manifest.json").read_text())
    eps = []
    for e in m["episodes"]:
        ep = msgpack.unpackb((demos / e["file"]).read_bytes())
        eps.append(ep)
    return m, eps


def check_loader(dataset, demos, a):
    """LeRobot's LeRobotDataset on reflex's export: every row against reflex's own records."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/reflex-pick", root=dataset, video_backend="pyav")
    manifest, eps = reflex_episodes(demos)
    frames = sum(len(e["actions"]) for e in eps)
    if ds.num_episodes != len(eps) or len(ds) != frames:
        fail(f"LeRobotDataset sees {ds.num_episodes} episodes, {len(ds)} frames; reflex recorded {len(eps)}, {frames}")
    cams = sorted(k for k in ds.meta.video_keys)
    state_err = action_err = 0.0
    image_err = {k: 0.0 for k in cams}
    i = 0
    for e, ep in enumerate(eps):
        frames_of = {c["camera"]: c for c in ep.get("cameras", [])}
        for t, action in enumerate(ep["actions"]):
            row = ds[i]
            i += 1
            if int(row["episode_index"]) != e or int(row["frame_index"]) != t:
                fail(f"row {i - 1}: episode {int(row['episode_index'])} frame {int(row['frame_index'])}, expected {e}, {t}")
            state = np.asarray(ep["observations"][t], np.float32)
            state_err = max(state_err, float(np.max(np.abs(row["observation.state"].numpy() - state))))
            action_err = max(action_err, float(np.max(np.abs(row["action"].numpy() - np.asarray(action, np.float32)))))
            for k in cams:
                cam = frames_of.get(k.removeprefix("observation.images."))
                if cam is None:
                    fail(f"{k}: reflex recorded no camera of that name")
                img = np.frombuffer(cam["frames"][t], np.uint8).reshape(cam["height"], cam["width"], 3).astype(np.float32)
                got = row[k].numpy().transpose(1, 2, 0) * 255.0
                image_err[k] = max(image_err[k], float(np.mean(np.abs(got - img))))
    # The export's values are the recorded float32s; a frame went through H.264 and back.
    if state_err > 0 or action_err > 0:
        fail(f"LeRobotDataset's states differ from reflex's by {state_err}, actions by {action_err}")
    worst = max(image_err.values())
    if worst > a.frame_tolerance:
        fail(f"a decoded frame differs from the recorded one by {worst:.1f} levels on average (> {a.frame_tolerance})")
    return {
        "episodes": ds.num_episodes,
        "frames": len(ds),
        "cameras": cams,
        "fps": ds.fps,
        "task": ds.meta.tasks.index[0],
        "frame_mean_abs_diff_levels": {k: round(v, 2) for k, v in image_err.items()},
    }, ds


def train_act(dataset, out, a):
    """lerobot-train, as a user runs it, on the CPU."""
    exe = Path(sys.prefix) / "bin" / "lerobot-train"
    sh([exe,
        "--dataset.repo_id=local/reflex-pick", f"--dataset.root={dataset}", "--dataset.video_backend=pyav",
        "--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false",
        "--policy.pretrained_backbone_weights=null",
        f"--policy.chunk_size={a.chunk_size}", f"--policy.n_action_steps={a.n_action_steps}",
        f"--steps={a.train_steps}", f"--batch_size={a.batch_size}", "--num_workers=0",
        f"--save_freq={a.train_steps}", f"--log_freq={max(1, a.train_steps // 10)}",
        "--wandb.enable=false", f"--seed={a.seed}", f"--output_dir={out}"],
       env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(a.threads)})
    ckpt = out / "checkpoints" / "last" / "pretrained_model"
    if not (ckpt / "model.safetensors").is_file():
        fail(f"lerobot-train left no checkpoint at {ckpt}")
    return ckpt


def run_config(path, model, a, episodes, seed):
    path.write_text(
        "[robot]\nsource = \"sim\"\n\n[sim]\ntask = \"pick\"\n\n[sim.cameras]\nenabled = true\n"
        f"width = {a.camera_size}\nheight = {a.camera_size}\n\n[policy]\nkind = \"onnx\"\n"
        f"model = \"{model}\"\n\n[run]\nepisodes = {episodes}\nseed = {seed}\nclock = \"sim\"\n"
    )
    return path


def success_of(report):
    for key in ("success_rate", "success"):
        if key in report:
            return report[key]
    fail(f"reflex run printed no success rate: {report}")


def rewrite_with_lerobot(ds, out, vcodec):
    """The loaded dataset written again by LeRobot's own writer with `vcodec`."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {k: v for k, v in ds.meta.features.items()
                if k in ("observation.state", "action") or k.startswith("observation.images.")}
    # LeRobot's default encoder settings (AV1 with libsvtav1), or the same with another codec.
    from lerobot.configs.video import RGBEncoderConfig

    enc = None if vcodec == "libsvtav1" else RGBEncoderConfig(vcodec=vcodec)
    new = LeRobotDataset.create("local/lerobot-written", fps=ds.fps, features=features, root=out,
                                robot_type=ds.meta.robot_type, use_videos=True, rgb_encoder=enc)
    task = ds.meta.tasks.index[0]
    ep = None
    for i in range(len(ds)):
        row = ds[i]
        e = int(row["episode_index"])
        if ep is not None and e != ep:
            new.save_episode()
        ep = e
        frame = {"task": task, "observation.state": row["observation.state"].numpy(), "action": row["action"].numpy()}
        for k in ds.meta.video_keys:
            frame[k] = (row[k].numpy().transpose(1, 2, 0) * 255.0).round().clip(0, 255).astype(np.uint8)
        new.add_frame(frame)
    new.save_episode()
    new.finalize()
    info = json.loads((out / "meta" / "info.json").read_text())
    return {k: info["features"][k]["info"]["video.codec"] for k in ds.meta.video_keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reflex", type=Path, required=True, help="the reflex binary")
    ap.add_argument("--work", type=Path, help="folder for every file (default: temporary)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--demos", type=int, default=20, help="expert episodes recorded")
    ap.add_argument("--camera-size", type=int, default=64)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--chunk-size", type=int, default=20, help="ACT's chunk_size")
    ap.add_argument("--n-action-steps", type=int, default=10)
    ap.add_argument("--run-episodes", type=int, default=20, help="episodes of the imported ACT alone")
    ap.add_argument("--demo-episodes", type=int, default=10, help="episodes the residual learner trains")
    ap.add_argument("--eval-episodes", type=int, default=20, help="held-out episodes, base and refined")
    ap.add_argument("--bc-steps", type=int, default=100, help="reflex bc train steps on LeRobot's own datasets")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frame-tolerance", type=float, default=12.0,
                    help="largest mean absolute difference of a decoded frame, in levels (H.264 at reflex's quantiser)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--reuse", action="store_true",
                    help="keep the demonstrations, dataset and trained checkpoint already in --work")
    a = ap.parse_args()

    import lerobot
    import torch

    torch.set_num_threads(a.threads)
    tmp = None
    if a.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="reflex-lerobot-path-")
        a.work = Path(tmp.name)
    w = a.work.resolve()
    w.mkdir(parents=True, exist_ok=True)
    reflex = a.reflex.resolve()
    if "ORT_DYLIB_PATH" not in os.environ:
        import onnxruntime

        libs = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
        if libs:
            os.environ["ORT_DYLIB_PATH"] = str(libs[-1])
    fig = {"lerobot_version": lerobot.__version__, "torch_version": torch.__version__, "seed": a.seed}
    wall = {}

    t = step("1. reflex records expert demonstrations with cameras")
    demos = w / "demos"
    dataset = w / "dataset"
    train = w / "train"
    reuse = a.reuse and (train / "checkpoints" / "last" / "pretrained_model").is_dir()
    if not reuse:
        shutil.rmtree(demos, ignore_errors=True)
        sh([reflex, "sim", "demos", "--task", "pick", "--cameras", "--camera-size", f"{a.camera_size}x{a.camera_size}",
            "--episodes", a.demos, "--noise", "0.2", "--seed", a.seed, "--out", demos])
    wall["demos_s"] = time.monotonic() - t

    t = step("2. reflex dataset export")
    if not reuse:
        shutil.rmtree(dataset, ignore_errors=True)
        sh([reflex, "dataset", "export", "--demos", demos, "--out", dataset, "--task", "pick up the cube"])
    wall["export_s"] = time.monotonic() - t

    t = step("3. LeRobot's LeRobotDataset loads it")
    fig["loader"], ds = check_loader(dataset, demos, a)
    wall["load_check_s"] = time.monotonic() - t

    t = step("4. lerobot-train trains ACT on the CPU")
    if reuse:
        ckpt = train / "checkpoints" / "last" / "pretrained_model"
    else:
        shutil.rmtree(train, ignore_errors=True)
        ckpt = train_act(dataset, train, a)
    wall["train_s"] = time.monotonic() - t
    fig["act"] = {"train_steps": a.train_steps, "batch_size": a.batch_size, "chunk_size": a.chunk_size,
                  "n_action_steps": a.n_action_steps}

    t = step("5. reflex policy import lerobot")
    model = w / "models" / "act.onnx"
    # The robot as `reflex run` will serve it, cameras at the size the demonstrations had, as a
    # user with a real robot passes its own spec.
    robot = w / "robot.json"
    robot.write_text(sh([reflex, "sim", "spec", "--task", "pick", "--cameras", "--camera-size",
                         f"{a.camera_size}x{a.camera_size}"], capture_output=True, text=True).stdout)
    sh([reflex, "policy", "import", "lerobot", ckpt, "--out", model, "--robot-spec", robot,
        "--tools-env", sys.prefix])
    sh([reflex, "policy", "check", "--model", model])
    wall["import_s"] = time.monotonic() - t

    t = step("6. reflex run: the imported ACT drives the simulator")
    cfg = run_config(w / "act-run.toml", model, a, a.run_episodes, a.seed + 100)
    out = sh([reflex, "run", "--config", cfg, "--json"], capture_output=True, text=True).stdout
    run = json.loads(out)
    fig["run"] = {"episodes": a.run_episodes, "success_rate": success_of(run)}
    wall["run_s"] = time.monotonic() - t

    t = step("7. reflex demo: the residual learner refines the imported ACT")
    out = sh([reflex, "demo", "--model", model, "--episodes", a.demo_episodes, "--eval-episodes", a.eval_episodes,
              "--seed", a.seed, "--runs", w / "runs", "--json"], capture_output=True, text=True).stdout
    demo = json.loads(out)
    held, base = demo.get("held_out"), demo.get("base_held_out")
    if held is None or base is None:
        fail(f"reflex demo measured no held-out success for the base alone and refined: {demo}")
    fig["refine"] = {
        "episodes": demo["episodes"],
        "held_out_episodes": held["episodes"],
        "base_alone": {"success_rate": base["success_rate"], "wilson_95": base["success_rate_wilson_95"]},
        "refined": {"success_rate": held["success_rate"], "wilson_95": held["success_rate_wilson_95"]},
        "intervention_rate_first_20": demo["intervention_rate_first_20"],
        "intervention_rate_last_20": demo["intervention_rate_last_20"],
        "wall_s": round(demo["wall_s"], 1),
    }
    wall["refine_s"] = time.monotonic() - t

    t = step("8. LeRobot's own writer, AV1 and H.264, into reflex bc train")
    fig["lerobot_written"] = {}
    for vcodec in ("libsvtav1", "h264"):
        out_ds = w / f"lerobot-{vcodec}"
        shutil.rmtree(out_ds, ignore_errors=True)
        codecs = rewrite_with_lerobot(ds, out_ds, vcodec)
        bc = w / "models" / f"bc-{vcodec}.onnx"
        trained = json.loads(sh([reflex, "bc", "train", "--dataset", out_ds, "--camera", "front", "--out", bc,
                                 "--steps", a.bc_steps, "--seed", a.seed, "--json"], capture_output=True, text=True).stdout)
        sh([reflex, "policy", "check", "--model", bc])
        fig["lerobot_written"][vcodec] = {"codecs": codecs, "bc_steps": a.bc_steps, "bc_final_loss": trained["final_loss"]}
    wall["lerobot_written_s"] = time.monotonic() - t

    fig["wall_s"] = {k: round(v, 1) for k, v in wall.items()}
    print(json.dumps(fig, indent=1))
    if a.json_out:
        a.json_out.write_text(json.dumps(fig, indent=1) + "\n")


if __name__ == "__main__":
    main()
