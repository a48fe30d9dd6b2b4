"""Export a LeRobot 0.6 checkpoint to ONNX for `reflex policy import lerobot`.

Run by reflex in the tools environment (.venv-lerobot, policies/import/requirements.txt); reflex
embeds this file in its binary and writes it to a temporary folder, so the command works outside
a checkout too. It reads the checkpoint with LeRobot's own classes (the policy and both processor
pipelines), so what it reports is what LeRobot computes, and writes:

- the ONNX graph of the network alone, between normalised inputs and normalised actions: ACT's
  whole forward pass, or Diffusion Policy's denoiser (reflex runs the sampler around it)
  (`torch.onnx.export`, TorchScript exporter, opset 17: ONNX Runtime 1.31 takes it; a model over
  2 GB puts its weights in files beside the graph, listed in the report);
- a JSON report: what each graph input is (LeRobot feature, type, shape) with the normalisation
  LeRobot's preprocessor applies to it, the action's unnormalisation from the postprocessor, the
  chunk settings (and the sampler's, for a diffusion policy), and how far ONNX Runtime's output
  is from torch's on random inputs.

reflex writes the policy spec from the report: the mapping onto the robot is reflex's business.
Anything this script does not reproduce exactly is refused with a line naming the checkpoint
file and the setting, exit status 1; nothing is written then.

    python lerobot_export.py --checkpoint DIR --onnx OUT/NAME.onnx --report OUT/export.json
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

# The TorchScript exporter is deprecated in torch 2.11 but the one that writes a graph ONNX
# Runtime takes at opset 17 (docs/bring-your-own-policy.md); ACT's loops over a fixed number of
# tokens make the tracer warn although the trace is right for every batch size.
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*might cause the trace to be incorrect.*")

# What the graph is checked against and how. Random normalised inputs: the chunk of ONNX Runtime
# and of torch agree within this on the CPU (both float32); a larger gap means the export lost
# something.
CHECK_TOLERANCE = 1e-4
OPSET = 17

PREPROCESSOR = "policy_preprocessor.json"
POSTPROCESSOR = "policy_postprocessor.json"


class Refused(Exception):
    """A checkpoint this exporter cannot reproduce exactly; the message says which setting."""


def log(msg):
    print(f"[lerobot export] {msg}", file=sys.stderr, flush=True)


def tolist(t):
    return [float(v) for v in t.detach().reshape(-1).cpu().tolist()]


def normalisation(step, key, ftype, shape, where):
    """The reflex normalisation of feature `key` as LeRobot's (un)normaliser `step` applies it."""
    from lerobot.configs.types import NormalizationMode

    if step is None:
        return {"kind": "none"}
    keys = getattr(step, "normalize_observation_keys", None)
    if keys is not None and ftype != "ACTION" and key not in keys:
        return {"kind": "none"}
    mode = step.norm_map.get(_feature_type(ftype), NormalizationMode.IDENTITY)
    stats = step._tensor_stats.get(key)
    if mode == NormalizationMode.IDENTITY or stats is None:
        # LeRobot leaves a feature without statistics as it is.
        return {"kind": "none"}
    eps = float(step.eps)
    if mode == NormalizationMode.MEAN_STD:
        return {"kind": "mean_std", "mean": tolist(stats["mean"]), "std": tolist(stats["std"]), "eps": eps}
    pairs = {
        NormalizationMode.MIN_MAX: ("min", "max"),
        NormalizationMode.QUANTILES: ("q01", "q99"),
        NormalizationMode.QUANTILE10: ("q10", "q90"),
    }
    if mode in pairs:
        lo, hi = pairs[mode]
        if lo not in stats or hi not in stats:
            raise Refused(f"{where}: feature `{key}` is normalised {mode.value} but its statistics lack `{lo}`/`{hi}`")
        # The same formula with other bounds: 2 (x - lo) / (hi - lo) - 1, eps where hi == lo.
        return {"kind": "min_max", "low": tolist(stats[lo]), "high": tolist(stats[hi]), "eps": eps}
    raise Refused(f"{where}: feature `{key}` uses normalisation {mode.value}, which reflex does not reproduce yet")


def _feature_type(name):
    from lerobot.configs.types import FeatureType

    return FeatureType(name)


def pipeline_steps(ckpt, filename, known):
    """LeRobot's pipeline `filename` from the checkpoint, its steps by registry name; a step reflex
    does not reproduce is refused by name."""
    from lerobot.processor import PolicyProcessorPipeline

    cfg = json.loads((ckpt / filename).read_text())
    pipe = PolicyProcessorPipeline.from_pretrained(str(ckpt), config_filename=filename)
    by_name = {}
    for entry, step in zip(cfg.get("steps", []), pipe.steps, strict=True):
        name = entry.get("registry_name") or entry.get("class", "?")
        if name not in known:
            raise Refused(
                f"{ckpt / filename}: step `{name}` is not one reflex reproduces yet "
                f"(it reproduces {', '.join(sorted(known))})"
            )
        by_name[name] = step
    return by_name


def act_network(policy, order):
    """ACT's network between normalised inputs and the normalised chunk, one graph input per
    feature (the cameras in the order LeRobot stacks them). Returns the module, its example
    inputs' extra leading entries (none) and the report's kind-specific part."""
    import torch

    from lerobot.utils.constants import OBS_IMAGES

    cfg = policy.config
    if cfg.temporal_ensemble_coeff is not None:
        # reflex ensembles chunks itself ([loop] chunks = { mode = "ensemble" }); the checkpoint's
        # coefficient is reported for the run config.
        log(f"temporal_ensemble_coeff = {cfg.temporal_ensemble_coeff}: set it in the run config's [loop] chunks")
    image_keys = list(cfg.image_features)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = policy.model

        def forward(self, *xs):
            batch = dict(zip(order, xs, strict=True))
            if image_keys:
                batch[OBS_IMAGES] = [batch[k] for k in image_keys]
            return self.model(batch)[0]

    return Net().eval(), [], {
        "kind": "chunk",
        "chunk_size": int(cfg.chunk_size),
        "temporal_ensemble_coeff": cfg.temporal_ensemble_coeff,
    }


def diffusion_network(policy, order, ckpt):
    """Diffusion Policy's denoiser: the noise (or sample) the U-Net predicts for a noisy chunk at
    an integer timestep, conditioned on the last n_obs_steps observations (state, and the cameras
    through their ResNet encoders, as LeRobot's `_prepare_global_conditioning` makes it). reflex
    runs the sampler (DDIM or DDPM, as the checkpoint says) around it and keeps the history; the
    observation encoders run at every step. The state arrives stacked flat, oldest first
    (B, n_obs_steps * dim), each camera as (B, n_obs_steps, 3, H, W) when n_obs_steps > 1."""
    import torch

    from lerobot.utils.constants import OBS_ENV_STATE, OBS_IMAGES, OBS_STATE

    cfg = policy.config
    where = ckpt / "config.json"
    if cfg.noise_scheduler_type not in ("DDIM", "DDPM"):
        raise Refused(f"{where}: noise_scheduler_type = {cfg.noise_scheduler_type} is not supported (DDPM and DDIM are)")
    if cfg.beta_schedule not in ("squaredcos_cap_v2", "linear"):
        raise Refused(f"{where}: beta_schedule = {cfg.beta_schedule} is not supported yet (squaredcos_cap_v2 and linear are)")
    model = policy.diffusion
    image_keys = list(cfg.image_features)
    fix_centre_crops(model, cfg)
    n_obs = int(cfg.n_obs_steps)
    state_key = OBS_STATE if cfg.robot_state_feature else None
    env_key = OBS_ENV_STATE if cfg.env_state_feature else None

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, noisy_actions, timestep, *xs):
            feats = dict(zip(order, xs, strict=True))
            # n observation steps: (B, n, ...), cameras stacked as select_action's queue holds them.
            batch = {}
            if state_key:
                batch[OBS_STATE] = feats[state_key].reshape(feats[state_key].shape[0], n_obs, -1)
            if env_key:
                batch[OBS_ENV_STATE] = feats[env_key].reshape(feats[env_key].shape[0], n_obs, -1)
            if image_keys:
                frames = [feats[k] if n_obs > 1 else feats[k].unsqueeze(1) for k in image_keys]
                batch[OBS_IMAGES] = torch.stack(frames, dim=-4)
            cond = self.model._prepare_global_conditioning(batch)
            return self.model.unet(noisy_actions, timestep, global_cond=cond)

    horizon, adim = int(cfg.horizon), int(cfg.action_feature.shape[0])
    steps = int(model.num_inference_steps)
    extra = [
        ("noisy_actions", torch.randn(1, horizon, adim, generator=torch.Generator().manual_seed(1))),
        ("timestep", torch.tensor([int(cfg.num_train_timesteps) // 2], dtype=torch.long)),
    ]
    return Net().eval(), extra, {
        "kind": "diffusion",
        "chunk_size": horizon,
        # LeRobot executes from the current step's row: its chunk starts at the oldest observation.
        "first_action": n_obs - 1,
        "history": n_obs,
        "temporal_ensemble_coeff": None,
        "graph": {"sample_input": "noisy_actions", "time_input": "timestep", "time_dtype": "int64", "time_shape": "batch"},
        "diffusion": {
            "train_steps": int(cfg.num_train_timesteps),
            "inference_steps": steps,
            "schedule": cfg.beta_schedule,
            "beta_start": float(cfg.beta_start),
            "beta_end": float(cfg.beta_end),
            "clip_sample": float(cfg.clip_sample_range) if cfg.clip_sample else 0.0,
            "prediction": cfg.prediction_type,
            "sampler": cfg.noise_scheduler_type.lower(),
        },
    }


def fix_centre_crops(model, cfg):
    """torchvision's CenterCrop computes its offsets from the image's size, which the tracer
    sees as a tensor (`round` of it fails); the size is fixed, so the same crop is a slice with
    the offsets torchvision computes: round((size - crop) / 2)."""
    import torch

    if cfg.crop_shape is None or not cfg.image_features:
        return
    size = cfg.resize_shape or next(iter(cfg.image_features.values())).shape[1:]
    ch, cw = cfg.crop_shape
    h, w = size
    if ch > h or cw > w:
        raise Refused(f"crop_shape {cfg.crop_shape} is larger than the images ({h}x{w}): LeRobot pads them, reflex does not yet")
    top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))

    class Crop(torch.nn.Module):
        def forward(self, x):
            return x[..., top : top + ch, left : left + cw]

    encoders = model.rgb_encoder if isinstance(model.rgb_encoder, torch.nn.ModuleList) else [model.rgb_encoder]
    for enc in encoders:
        if enc.do_crop:
            enc.center_crop = Crop()


POLICIES = {
    "act": ("lerobot.policies.act.modeling_act", "ACTPolicy"),
    "diffusion": ("lerobot.policies.diffusion.modeling_diffusion", "DiffusionPolicy"),
}


def export(ckpt, onnx_path, report_path):
    t0 = time.monotonic()
    config = json.loads((ckpt / "config.json").read_text())
    ptype = config.get("type")
    if ptype not in POLICIES:
        raise Refused(f"{ckpt / 'config.json'}: policy type `{ptype}` is not supported yet ({', '.join(POLICIES)} are)")

    import importlib

    import numpy as np
    import onnxruntime as ort
    import torch

    import lerobot

    torch.set_num_threads(1)
    log(f"LeRobot {lerobot.__version__}, torch {torch.__version__}: loading {ckpt}")
    module, cls = POLICIES[ptype]
    try:
        policy = getattr(importlib.import_module(module), cls).from_pretrained(str(ckpt))
    except Exception as e:  # noqa: BLE001 - any failure here is the checkpoint's; say which file
        raise Refused(f"{ckpt / 'model.safetensors'}: LeRobot cannot load the policy from it ({type(e).__name__}: {e})") from e
    policy.eval()
    cfg = policy.config

    pre = pipeline_steps(
        ckpt,
        PREPROCESSOR,
        {"rename_observations_processor", "to_batch_processor", "device_processor", "normalizer_processor"},
    )
    post = pipeline_steps(ckpt, POSTPROCESSOR, {"unnormalizer_processor", "device_processor"})
    rename = getattr(pre.get("rename_observations_processor"), "rename_map", {}) or {}
    normalizer = pre.get("normalizer_processor")
    unnormalizer = post.get("unnormalizer_processor")

    inputs = []
    for key, feat in cfg.input_features.items():
        ftype = feat.type.value
        if ftype not in ("STATE", "ENV", "VISUAL"):
            raise Refused(f"{ckpt / 'config.json'}: input feature `{key}` of type {ftype} is not supported yet")
        norm = normalisation(normalizer, key, ftype, feat.shape, ckpt / PREPROCESSOR)
        inputs.append({"feature": key, "type": ftype, "shape": list(feat.shape), "normalize": norm})
    action_key, action_feat = next(iter(cfg.output_features.items()))
    action_norm = normalisation(unnormalizer, action_key, "ACTION", action_feat.shape, ckpt / POSTPROCESSOR)

    order = [i["feature"] for i in inputs]
    if ptype == "act":
        net, extra, kind_report = act_network(policy, order)
        out_name = action_key
    else:
        net, extra, kind_report = diffusion_network(policy, order, ckpt)
        out_name = "eps" if cfg.prediction_type == "epsilon" else "sample"
    kind_report.setdefault("graph", {})["output"] = out_name
    gen = torch.Generator().manual_seed(0)
    hist = int(kind_report.get("history", 1))

    def example_shape(i):
        # A stacked history: the state flat (oldest first), each camera's frames on their own axis.
        if hist == 1:
            return i["shape"]
        if i["type"] == "VISUAL":
            return [hist, *i["shape"]]
        return [hist * i["shape"][0]]

    example = tuple(x for _, x in extra) + tuple(torch.randn(1, *example_shape(i), generator=gen) for i in inputs)
    names = [n for n, _ in extra] + order
    params = sum(p.numel() for p in net.parameters())
    log(f"exporting {params / 1e6:.1f} M parameters to ONNX (opset {OPSET})")
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            net,
            example,
            str(onnx_path),
            input_names=names,
            output_names=[out_name],
            dynamic_axes={n: {0: "batch"} for n in [*names, out_name]},
            opset_version=OPSET,
            dynamo=False,
        )

    import onnx

    # The checker follows external data files, so a graph whose weights went beside it is checked
    # whole; every file the export wrote travels with the model.
    onnx.checker.check_model(str(onnx_path), full_check=False)
    files = sorted(p.name for p in onnx_path.parent.iterdir() if p.name != report_path.name)

    log("checking ONNX Runtime's output against torch's")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = net(*example).numpy()
    got = sess.run([out_name], {n: x.numpy() for n, x in zip(names, example, strict=True)})[0]
    diff = float(np.max(np.abs(got - want)))
    if not diff <= CHECK_TOLERANCE:
        raise Refused(f"the exported graph's output is {diff:.3g} from torch's (tolerance {CHECK_TOLERANCE}): the export lost something")

    report = {
        "format": "reflex-lerobot-export",
        "version": 1,
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "type": ptype,
        "n_action_steps": int(cfg.n_action_steps),
        "rename_map": rename,
        "inputs": inputs,
        "output": {"name": out_name, "feature": action_key, "shape": list(action_feat.shape), "normalize": action_norm},
        "parameters": params,
        "opset": OPSET,
        "files": files,
        "onnx_vs_torch_max_abs": diff,
        **kind_report,
    }
    report["seconds"] = time.monotonic() - t0
    report_path.write_text(json.dumps(report, indent=1))
    log(f"done in {report['seconds']:.0f} s (ONNX Runtime within {diff:.2g} of torch)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--onnx", type=Path, required=True)
    ap.add_argument("--report", type=Path, required=True)
    a = ap.parse_args()
    try:
        export(a.checkpoint, a.onnx, a.report)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
