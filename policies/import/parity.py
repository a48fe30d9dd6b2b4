"""Parity of `reflex policy import lerobot` with LeRobot itself (`make parity`).

Builds a LeRobot 0.6.1 ACT checkpoint with LeRobot's own classes (random weights, ResNet-18 not
pretrained: nothing is downloaded) whose features are those of reflex's simulated `pick` robot,
saves it the way `lerobot-train` does (the policy, then both processor pipelines with their
statistics), imports it with reflex, and runs the same observations through both:

- LeRobot: `prepare_observation_for_inference` (uint8 camera frames to [0, 1], channel first),
  the checkpoint's preprocessor, `predict_action_chunk`, the postprocessor (unnormalisation);
- reflex: `reflex policy infer` on the imported model (its spec's normalisation, ONNX Runtime).

It prints the largest difference between the two chunks (in the robot's units) and each side's
time per chunk (median, one thread each: torch.set_num_threads(1), ONNX Runtime's
intra_threads = 1), writes them as JSON with --json-out, and exits 1 when the difference is
above 1e-4.

    .venv-lerobot/bin/python policies/import/parity.py --reflex target/release/reflex

The checkpoint maps one of its cameras by another name (`observation.images.top` onto the
robot's `front`) so the importer's --map is part of what is checked.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOLERANCE = 1e-4


def sh(cmd, **kw):
    print("$ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def make_checkpoint(out, robot, seed, chunk_size, n_action_steps):
    """An ACT checkpoint for `robot` as lerobot-train saves one, with random weights and
    statistics; returns its image feature keys with the robot camera each reads."""
    import torch

    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.act.processor_act import make_act_pre_post_processors

    torch.manual_seed(seed)
    state_dim = sum(f["size"] for f in robot["state"])
    action_dim = len(robot["action"]["names"])
    cams = robot["cameras"]
    # The first camera under another name (mapped with --map), the others under their own.
    keys = {("observation.images.top" if i == 0 else f"observation.images.{c['name']}"): c for i, c in enumerate(cams)}
    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))}
    for k, c in keys.items():
        inputs[k] = PolicyFeature(FeatureType.VISUAL, (3, c["height"], c["width"]))
    cfg = ACTConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
        pretrained_backbone_weights=None,
        device="cpu",
        chunk_size=chunk_size,
        n_action_steps=n_action_steps,
    )
    policy = ACTPolicy(cfg)
    stats = {
        "observation.state": {"mean": torch.randn(state_dim), "std": torch.rand(state_dim) + 0.1},
        # Actions of order one, so a wrong statistic or formula shows far above the tolerance.
        "action": {"mean": torch.randn(action_dim), "std": torch.rand(action_dim) + 0.5},
    }
    # Per channel, shaped (3, 1, 1) as LeRobot's compute_stats writes image statistics.
    for k in keys:
        stats[k] = {"mean": torch.rand(3, 1, 1) * 0.4 + 0.3, "std": torch.rand(3, 1, 1) * 0.2 + 0.1}
    pre, post = make_act_pre_post_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    params = sum(p.numel() for p in policy.parameters())
    return {k: c["name"] for k, c in keys.items()}, stats, params


def observations(robot, stats, n, seed):
    """`n` observations: states drawn around the checkpoint's statistics, random camera frames."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mean = stats["observation.state"]["mean"].numpy()
    std = stats["observation.state"]["std"].numpy()
    out = []
    for _ in range(n):
        state = (mean + std * rng.standard_normal(mean.shape)).astype(np.float32)
        images = {c["name"]: rng.integers(0, 256, (c["height"], c["width"], 3), dtype=np.uint8) for c in robot["cameras"]}
        out.append((state, images))
    return out


def lerobot_chunks(ckpt, cams, obs, warmup, repeat):
    import torch

    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.utils import prepare_observation_for_inference

    policy = ACTPolicy.from_pretrained(str(ckpt))
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(ckpt))
    chunks, times = [], []
    for state, images in obs:
        t = []
        for r in range(warmup + repeat):
            frame = {"observation.state": state.copy()}
            for key, cam in cams.items():
                frame[key] = images[cam].copy()
            t0 = time.perf_counter()
            batch = prepare_observation_for_inference(frame, torch.device("cpu"))
            batch = pre(batch)
            with torch.no_grad():
                actions = policy.predict_action_chunk(batch)
            actions = post(actions)
            dt = time.perf_counter() - t0
            if r >= warmup:
                t.append(dt * 1e6)
            if r == 0:
                chunks.append(actions[0].numpy())
        times.append(sorted(t)[len(t) // 2])
    return chunks, times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reflex", type=Path, required=True, help="the reflex binary")
    ap.add_argument("--task", default="pick", help="the simulated robot (sim/<task>)")
    ap.add_argument("--work", type=Path, help="folder for the checkpoint, model and files (default: temporary)")
    ap.add_argument("--observations", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-size", type=int, default=100, help="ACT's chunk_size (LeRobot's default 100)")
    ap.add_argument("--n-action-steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    a = ap.parse_args()

    import numpy as np
    import torch

    import lerobot

    torch.set_num_threads(1)
    tmp = None
    if a.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="reflex-parity-")
        a.work = Path(tmp.name)
    a.work.mkdir(parents=True, exist_ok=True)
    reflex = a.reflex.resolve()
    # reflex loads the ONNX Runtime of this environment (the release tests/requirements.txt pins)
    # unless told otherwise, so the check needs no other environment.
    if "ORT_DYLIB_PATH" not in os.environ:
        import onnxruntime

        libs = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
        if libs:
            os.environ["ORT_DYLIB_PATH"] = str(libs[-1])

    robot = json.loads(sh([reflex, "sim", "spec", "--task", a.task, "--cameras"], capture_output=True, text=True).stdout)
    ckpt = a.work / "pretrained_model"
    cams, stats, params = make_checkpoint(ckpt, robot, a.seed, a.chunk_size, a.n_action_steps)
    model = a.work / "models" / "act-parity.onnx"
    maps = [arg for k, cam in cams.items() if not k.endswith("." + cam) for arg in ("--map", f"{k}={cam}")]
    t0 = time.monotonic()
    sh([reflex, "policy", "import", "lerobot", ckpt, "--out", model, "--robot-kind", f"sim/{a.task}",
        "--tools-env", sys.prefix, *maps])
    import_s = time.monotonic() - t0

    obs = observations(robot, stats, a.observations, a.seed + 1)
    obs_file = a.work / "observations.json"
    obs_file.write_text(json.dumps({"observations": [
        {"state": s.tolist(), "images": [
            {"camera": cam, "width": int(img.shape[1]), "height": int(img.shape[0]), "rgb8": img.reshape(-1).tolist()}
            for cam, img in images.items()]}
        for s, images in obs]}))
    out = sh([reflex, "policy", "infer", "--model", model, "--observations", obs_file,
              "--warmup", a.warmup, "--repeat", a.repeat], capture_output=True, text=True).stdout
    ours = json.loads(out)
    theirs, lerobot_us = lerobot_chunks(ckpt, cams, obs, a.warmup, a.repeat)

    diffs = [float(np.max(np.abs(np.asarray(r, dtype=np.float32) - l))) for r, l in zip(ours["chunks"], theirs, strict=True)]
    scale = float(max(np.max(np.abs(l)) for l in theirs))
    figures = {
        "task": a.task,
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "policy": "act",
        "parameters_m": round(params / 1e6, 1),
        "chunk_size": a.chunk_size,
        "cameras": list(cams.values()),
        "observations": a.observations,
        "max_abs_diff": max(diffs),
        "largest_action_abs": scale,
        "tolerance": TOLERANCE,
        "reflex_chunk_us_p50": float(np.median(ours["chunk_us"])),
        "lerobot_chunk_us_p50": float(np.median(lerobot_us)),
        "threads": 1,
        "import_s": round(import_s, 1),
    }
    print(json.dumps(figures, indent=1))
    if a.json_out:
        a.json_out.write_text(json.dumps(figures, indent=1) + "\n")
    ok = figures["max_abs_diff"] <= TOLERANCE
    print(
        f"ACT on sim/{a.task} ({figures['parameters_m']} M parameters, chunk {a.chunk_size}, cameras {figures['cameras']}): "
        f"reflex vs LeRobot max |diff| {figures['max_abs_diff']:.2e} over {a.observations} observations "
        f"(actions up to {scale:.3g}) {'<=' if ok else '>'} {TOLERANCE}; per chunk, 1 thread: "
        f"reflex {figures['reflex_chunk_us_p50'] / 1e3:.1f} ms, LeRobot {figures['lerobot_chunk_us_p50'] / 1e3:.1f} ms",
        file=sys.stderr,
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
