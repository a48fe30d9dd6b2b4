"""Export a LeRobot 0.6 checkpoint to ONNX for `reflex policy import lerobot`.

Run by reflex in the tools environment (.venv-lerobot, policies/import/requirements.txt); reflex
embeds this file in its binary and writes it to a temporary folder, so the command works outside
a checkout too. It reads the checkpoint with LeRobot's own classes (the policy and both processor
pipelines), so what it reports is what LeRobot computes, and writes:

- the ONNX graph of the network alone, between normalised inputs and normalised actions: ACT's
  whole forward pass, Diffusion Policy's observation encoders (once per chunk) and U-Net (reflex
  runs the sampler around it), or a flow
  VLA's two graphs (SmolVLA, pi0, pi0.5), the prefix (cameras, instruction, and for SmolVLA the
  state, to every layer's cached keys and values) and the action expert's velocity against that
  cache (reflex integrates), with the tokenizer of its VLM beside them
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
    runs the sampler (DDIM or DDPM, as the checkpoint says) around it and keeps the history. As
    two graphs: the observation encoders once per chunk (a prefix graph returning the U-Net's
    `global_cond`), the U-Net at every step; the whole in one module is the reference. The state
    arrives stacked flat, oldest first (B, n_obs_steps * dim), each camera as
    (B, n_obs_steps, 3, H, W) when n_obs_steps > 1."""
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

    def conditioning(xs):
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
        return model._prepare_global_conditioning(batch)  # noqa: SLF001

    class Net(torch.nn.Module):
        """The whole denoiser in one: the reference the two graphs are checked against."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, noisy_actions, timestep, *xs):
            return self.model.unet(noisy_actions, timestep, global_cond=conditioning(xs))

    class Prefix(torch.nn.Module):
        """The observation encoders (ResNets, state) to the U-Net's global conditioning."""

        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *xs):
            return conditioning(xs)

    class Denoiser(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, noisy_actions, timestep, global_cond):
            return self.model.unet(noisy_actions, timestep, global_cond=global_cond)

    horizon, adim = int(cfg.horizon), int(cfg.action_feature.shape[0])
    steps = int(model.num_inference_steps)
    extra = [
        ("noisy_actions", torch.randn(1, horizon, adim, generator=torch.Generator().manual_seed(1))),
        ("timestep", torch.tensor([int(cfg.num_train_timesteps) // 2], dtype=torch.long)),
    ]
    return (Net().eval(), Prefix().eval(), Denoiser().eval()), extra, {
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
    "smolvla": ("lerobot.policies.smolvla.modeling_smolvla", "SmolVLAPolicy"),
    "pi0": ("lerobot.policies.pi0.modeling_pi0", "PI0Policy"),
    "pi05": ("lerobot.policies.pi05.modeling_pi05", "PI05Policy"),
}
VLAS = ("smolvla", "pi0", "pi05")

# The graph inputs a VLA's instruction arrives on (LeRobot's batch keys for them).
LANG_TOKENS = "observation.language.tokens"
LANG_MASK = "observation.language.attention_mask"
PREFIX_OUTPUTS = ["prefix_keys", "prefix_values", "prefix_pad_mask"]
# pi0 feeds the state to the action expert, not the prefix: the prefix graph passes the padded,
# normalised state on with its cache.
PI0_STATE = "prefix_state"

# LeRobot builds pi0 only from the published Gemma variants (PaliGemma's gemma_2b with a
# gemma_300m action expert, SigLIP So400m: 3.3 B parameters, 13 GB in float32). A reduced pi0 of
# the same architecture, for parity checks on small machines, redefines those variants: this
# environment variable names a JSON file {"variants": {"gemma_2b": {width, depth, mlp_dim,
# num_heads, num_kv_heads, head_dim}, "gemma_300m": {...}}, "vision_layers": N}. The report
# records it. Nothing else reads it.
PI0_REDUCED_ENV = "REFLEX_PI0_REDUCED"


def reduce_pi0(spec, ptype="pi0"):
    """Makes LeRobot's pi0 (or pi0.5, `ptype` "pi05") build the reduced variants `spec` names
    (see PI0_REDUCED_ENV): its `get_gemma_config` returns them, and PaliGemma's SigLIP tower
    keeps `vision_layers` layers. Widths, heads and the vocabulary stay LeRobot's (its code fixes
    the projection to 2048 wide and eight heads)."""
    import importlib

    pi0 = importlib.import_module(f"lerobot.policies.{ptype}.modeling_{ptype}")

    published = pi0.get_gemma_config
    mapping = pi0.CONFIG_MAPPING

    def gemma(variant):
        v = spec["variants"].get(variant)
        return pi0.GemmaConfig(**v) if v is not None else published(variant)

    class Mapping:
        def __getitem__(self, name):
            make = mapping[name]
            if name != "paligemma":
                return make

            def paligemma(*args, **kw):
                cfg = make(*args, **kw)
                cfg.vision_config.num_hidden_layers = int(spec["vision_layers"])
                return cfg

            return paligemma

    pi0.get_gemma_config = gemma
    pi0.CONFIG_MAPPING = Mapping()


def vlm_present(ckpt, config):
    """SmolVLA builds its backbone from `vlm_model_name`'s configuration and tokenises with its
    tokenizer; both must be on this machine (a local folder, or the Hugging Face cache that
    running the policy in LeRobot fills)."""
    from transformers import AutoConfig, AutoTokenizer

    name = config.get("vlm_model_name", "HuggingFaceTB/SmolVLM2-500M-Video-Instruct")
    if Path(name).is_dir():
        fix = f"the folder {name} needs the VLM's config.json and its tokenizer files (tokenizer.json, tokenizer_config.json)"
    else:
        fix = (
            f"download it once where there is a network (`hf download {name}`, or run the policy in LeRobot there) "
            f"and copy the Hugging Face cache, or set `vlm_model_name` in {ckpt / 'config.json'} to a local folder holding it"
        )
    for what, load in (("configuration", AutoConfig.from_pretrained), ("tokenizer", AutoTokenizer.from_pretrained)):
        try:
            load(name)
        except Exception as e:  # noqa: BLE001 - any failure means the files are not here
            raise Refused(
                f"{ckpt / 'config.json'}: the VLM `{name}` (vlm_model_name) has no {what} on this machine "
                f"({type(e).__name__}); reflex downloads nothing: {fix}"
            ) from e


def register_bool_cumsum():
    """torch sums a bool tensor as int64 (LeRobot's position ids are `cumsum` of the padding
    mask); ONNX's CumSum takes no bool, so the exporter casts it first."""
    import torch
    from torch.onnx._internal.torchscript_exporter import symbolic_helper

    @symbolic_helper.parse_args("v", "i", "none")
    def cumsum(g, x, dim, dtype=None):
        if x.type().scalarType() == "Bool":
            x = g.op("Cast", x, to_i=7)  # INT64
        return g.op("CumSum", x, g.op("Constant", value_t=torch.tensor(dim, dtype=torch.int)))

    torch.onnx.register_custom_op_symbolic("aten::cumsum", cumsum, OPSET)


def tokenizer_present(ckpt):
    """pi0 tokenises with PaliGemma's tokenizer (`tokenizer_name` in the preprocessor's tokenizer
    step, `google/paligemma-3b-pt-224`), which must be on this machine: a local folder or the
    Hugging Face cache that running the policy in LeRobot fills."""
    from transformers import AutoTokenizer

    cfg = json.loads((ckpt / PREPROCESSOR).read_text())
    steps = [s for s in cfg.get("steps", []) if s.get("registry_name") == "tokenizer_processor"]
    if not steps:
        raise Refused(f"{ckpt / PREPROCESSOR}: no `tokenizer_processor` step: the instruction cannot be tokenised as LeRobot does")
    name = steps[0].get("config", {}).get("tokenizer_name") or "google/paligemma-3b-pt-224"
    try:
        AutoTokenizer.from_pretrained(name)
    except Exception as e:  # noqa: BLE001 - any failure means the files are not here
        raise Refused(
            f"{ckpt / PREPROCESSOR}: the tokenizer `{name}` (tokenizer_name) is not on this machine ({type(e).__name__}); "
            f"reflex downloads nothing: download it once where there is a network (`hf download {name} --include 'tokenizer*' 'config.json'`; "
            f"PaliGemma's licence must be accepted on the hub first) and copy the Hugging Face cache, or set `tokenizer_name` "
            f"to a local folder holding tokenizer.json"
        ) from e


def export_patches(vision, height, width):
    """What the TorchScript exporter needs to write SmolVLM's graph, each exact for how LeRobot
    calls it (every image patch valid, `patch_attention_mask=None`):

    - the vision embeddings' position ids depend only on the image size then; transformers
      computes them with a boolean scatter the exporter types wrongly, so they are computed once
      by transformers itself (recorded at its position embedding) and kept as a constant;
    - the vision encoder's all-true attention mask is built by transformers' masking utilities,
      which fail under the tracer; an all-true mask and no mask attend alike, so none is built;
    - torch sums a bool tensor as int64 (LeRobot's position ids, `cumsum` of the padding mask);
      ONNX's CumSum takes no bool, so it is cast first.
    """
    import types

    import torch
    import transformers.models.smolvlm.modeling_smolvlm as smolvlm

    emb = vision.embeddings
    p = emb.patch_size
    seen = {}
    hook = emb.position_embedding.register_forward_pre_hook(lambda _m, a: seen.setdefault("ids", a[0].clone()))
    with torch.no_grad():
        emb(torch.zeros(1, 3, height, width), torch.ones(1, height // p, width // p, dtype=torch.bool))
    hook.remove()
    ids = seen["ids"]

    def full_patch_embeddings(self, pixel_values, patch_attention_mask):
        e = self.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        return e + self.position_embedding(ids.expand(pixel_values.shape[0], -1))

    emb.forward = types.MethodType(full_patch_embeddings, emb)
    smolvlm.create_bidirectional_mask = lambda config, inputs_embeds, attention_mask, **kw: None
    register_bool_cumsum()


def smolvla_graphs(policy, order, image_keys, state_key):
    """SmolVLA as two graphs, as LeRobot runs it: the prefix (the cameras through SmolVLM's
    vision encoder, the instruction's tokens, the padded state, through the VLM's layers) to the
    keys and values every layer caches, once per chunk; and the action expert's velocity for a
    noisy chunk at a time against that cache, per Euler step. Inside, the calls are LeRobot's
    own (`prepare_images`: resize with padding and [-1, 1]; `prepare_state`: zero padding to
    `max_state_dim`; `embed_prefix`, `denoise_step`). LeRobot integrates from noise at t = 1 with
    dt = -1/steps, reflex from t = 0 to 1, so the expert graph returns -v(x, 1 - t): the same
    Euler steps on the same values."""
    import torch
    from transformers import DynamicCache

    from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

    model = policy.model

    class Prefix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *xs):
            feats = dict(zip(order, xs, strict=True))
            batch = {k: feats[k] for k in image_keys}
            batch["observation.state"] = feats[state_key]
            images, img_masks = policy.prepare_images(batch)
            state = policy.prepare_state(batch)
            embs, pad, att = self.model.embed_prefix(images, img_masks, feats[LANG_TOKENS], feats[LANG_MASK] > 0, state=state)
            att2 = make_att_2d_masks(pad, att)
            pos = torch.cumsum(pad, dim=1) - 1
            _, cache = self.model.vlm_with_expert.forward(
                attention_mask=att2, position_ids=pos, past_key_values=None, inputs_embeds=[embs, None], use_cache=True
            )
            keys = torch.stack([layer.keys for layer in cache.layers])
            values = torch.stack([layer.values for layer in cache.layers])
            return keys, values, pad.to(torch.float32)

    class Expert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x_t, t, keys, values, pad):
            cache = DynamicCache()
            for i in range(keys.shape[0]):
                cache.update(keys[i], values[i], i)
            v = self.model.denoise_step(prefix_pad_masks=pad > 0.5, past_key_values=cache, x_t=x_t, timestep=1.0 - t.reshape(-1))
            return -v

    return Prefix().eval(), Expert().eval()


def static_resize_with_pad(images, height, width, mode="bilinear"):
    """openpi's resize with centred padding (LeRobot's `resize_with_pad_torch`: scale to fit
    `height x width` keeping the aspect ratio, clamp to [0, 1], pad with zeros evenly), with the
    sizes computed from the image's shape as Python numbers, as LeRobot computes them. Under the
    tracer the shape is a tensor and the same arithmetic in float32 rounds 128 / (128 / 224) down
    to 223: the graph would resize to a column short."""
    import torch.nn.functional as F  # noqa: N812

    last = images.shape[-1] <= 4
    x = images.permute(0, 3, 1, 2) if last else images
    h, w = (int(d) for d in x.shape[2:])
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    x = F.interpolate(x, size=(rh, rw), mode=mode, align_corners=False if mode == "bilinear" else None).clamp(0.0, 1.0)
    top, left = (height - rh) // 2, (width - rw) // 2
    x = F.pad(x, (left, width - rw - left, top, height - rh - top), mode="constant", value=0.0)
    return x.permute(0, 2, 3, 1) if last else x


def pi0_graphs(policy, order, image_keys, state_key, ptype="pi0"):
    """pi0 (and pi0.5, `ptype` "pi05") as two graphs, as LeRobot runs them: the prefix (the
    cameras through PaliGemma's SigLIP tower, the instruction's tokens, through Gemma's layers)
    to every layer's cached keys and values, once per chunk; the action expert's velocity for a
    noisy chunk and the time against that cache, per Euler step. pi0 embeds the state in the
    expert's input, so its prefix graph hands the padded state on as `prefix_state`; pi0.5 reads
    the state only as text in its prompt, so neither graph takes it. Inside, the calls are
    LeRobot's own (`_preprocess_images`: resize with padding to 224 and [-1, 1];
    `prepare_state`: zero padding to `max_state_dim`; `embed_prefix`, `denoise_step`); the
    expert returns -v(x, 1 - t) as SmolVLA's does (reflex integrates from t = 0)."""
    import importlib

    import torch
    from transformers import DynamicCache

    pi = importlib.import_module(f"lerobot.policies.{ptype}.modeling_{ptype}")
    pi.resize_with_pad_torch = static_resize_with_pad
    model = policy.model
    pwe = model.paligemma_with_expert
    # LeRobot sets these before each call; the graphs are traced with the same.
    pwe.paligemma.model.language_model.config._attn_implementation = "eager"  # noqa: SLF001
    pwe.gemma_expert.model.config._attn_implementation = "eager"  # noqa: SLF001
    with_state = ptype == "pi0"

    class Prefix(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *xs):
            feats = dict(zip(order, xs, strict=True))
            images, img_masks = policy._preprocess_images({k: feats[k] for k in image_keys})  # noqa: SLF001
            embs, pad, att = self.model.embed_prefix(images, img_masks, feats[LANG_TOKENS], feats[LANG_MASK] > 0)
            mask = pi.prepare_attention_masks_4d(pi.make_att_2d_masks(pad, att))
            pos = torch.cumsum(pad, dim=1) - 1
            _, cache = pwe.forward(attention_mask=mask, position_ids=pos, past_key_values=None, inputs_embeds=[embs, None], use_cache=True)
            keys = torch.stack([layer.keys for layer in cache.layers])
            values = torch.stack([layer.values for layer in cache.layers])
            if not with_state:
                return keys, values, pad.to(torch.float32)
            return keys, values, pad.to(torch.float32), policy.prepare_state({"observation.state": feats[state_key]})

    class Expert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x_t, t, keys, values, pad, *state):
            cache = DynamicCache()
            for i in range(keys.shape[0]):
                cache.update(keys[i], values[i], i)
            step = dict(prefix_pad_masks=pad > 0.5, past_key_values=cache, x_t=x_t, timestep=1.0 - t.reshape(-1))
            v = self.model.denoise_step(*state, **step)
            return -v

    return Prefix().eval(), Expert().eval()


def flow_vla_parts(policy, ptype):
    """What differs between the flow VLAs: their two graphs' builder, the prefix graph's
    outputs, the preprocessor's newline step, the Euler step count, and LeRobot's own sampling
    call (images and state prepared its way) for the check."""
    cfg = policy.config
    if ptype == "smolvla":
        # SmolVLA keeps the size as (width, height).
        width, height = cfg.resize_imgs_with_padding or next(iter(cfg.image_features.values())).shape[:0:-1]
        export_patches(policy.model.vlm_with_expert.get_vlm_model().vision_model, height, width)

        def reference(batch, tokens, mask, n_tok, noise):
            # Unpadded, as LeRobot's "longest" padding leaves a single instruction.
            images, img_masks = policy.prepare_images(batch)
            state = policy.prepare_state(batch)
            return policy.model.sample_actions(images, img_masks, tokens[:, :n_tok], mask[:, :n_tok] > 0, state, noise=noise)

        return smolvla_graphs, PREFIX_OUTPUTS, "smolvla_new_line_processor", int(cfg.num_steps), reference
    register_bool_cumsum()

    def reference(batch, tokens, mask, n_tok, noise):
        # Padded to max_length, as pi0's tokenizer step pads; pi0.5 takes no state here.
        images, img_masks = policy._preprocess_images(batch)  # noqa: SLF001
        state = [policy.prepare_state(batch)] if ptype == "pi0" else []
        return policy.model.sample_actions(images, img_masks, tokens, mask > 0, *state, noise=noise)

    def graphs(policy, order, image_keys, state_key):
        return pi0_graphs(policy, order, image_keys, state_key, ptype)

    outputs = [*PREFIX_OUTPUTS, PI0_STATE] if ptype == "pi0" else PREFIX_OUTPUTS
    return graphs, outputs, f"{ptype}_new_line_processor", int(cfg.num_inference_steps), reference


def export_graph(module, example, path, input_names, output_names):
    """`torch.onnx.export` of `module`; a graph over protobuf's 2 GB limit gets its weights in one
    file beside it (`NAME.onnx.data`) instead of the file per tensor the exporter writes."""
    import onnx
    import torch

    before = set(path.parent.iterdir())
    torch.onnx.export(module, example, str(path), input_names=input_names, output_names=output_names, opset_version=OPSET, dynamo=False)
    strays = [f for f in set(path.parent.iterdir()) - before if f != path]
    if strays:
        model = onnx.load(str(path))
        data = path.name + ".data"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=1024)
        for f in strays:
            if f.name != data:
                f.unlink()
        (path.parent / data).chmod(0o644)  # onnx writes it owner-only; it travels like the graph
        log(f"{path.name}: its weights are in {data} beside it ({(path.parent / data).stat().st_size / 1e9:.2f} GB)")


def export_flow_vla(policy, ptype, pre, inputs, ckpt, onnx_path):
    """Writes a flow VLA's two graphs (SmolVLA, pi0) and the tokenizer beside `onnx_path`;
    returns the report's kind-specific part and how far ONNX Runtime's chunk (both graphs,
    reflex's integration) is from LeRobot's `sample_actions` on random inputs with the same
    noise."""
    import numpy as np
    import onnxruntime as ort
    import torch

    cfg = policy.config
    where = ckpt / PREPROCESSOR
    tok_step = pre.get("tokenizer_processor")
    if tok_step is None:
        raise Refused(f"{where}: no `tokenizer_processor` step: the instruction cannot be tokenised as LeRobot does")
    if tok_step.padding_side != "right":
        raise Refused(f"{where}: the tokenizer pads on the {tok_step.padding_side}; reflex pads on the right")
    tokenizer = tok_step.input_tokenizer
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise Refused(f"{where}: the tokenizer `{tok_step.tokenizer_name}` is not a fast (tokenizer.json) tokenizer, which reflex reads")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    max_len = int(tok_step.max_length)

    image_keys = list(cfg.image_features)
    state_key = "observation.state"
    if cfg.robot_state_feature is None:
        raise Refused(f"{ckpt / 'config.json'}: a {ptype} without `observation.state` is not supported yet")
    order = [i["feature"] for i in inputs] + [LANG_TOKENS, LANG_MASK]
    graphs, outputs, newline_step, steps, reference = flow_vla_parts(policy, ptype)
    prefix, expert = graphs(policy, order, image_keys, state_key)

    # The check's inputs: random normalised state and [0, 1] frames, a real instruction.
    gen = torch.Generator().manual_seed(0)
    feats = []
    for i in inputs:
        feats.append(torch.rand(1, *i["shape"], generator=gen) if i["type"] == "VISUAL" else torch.randn(1, *i["shape"], generator=gen))
    enc = tokenizer("pick up the cube and place it on the target\n", truncation=True, max_length=max_len)
    n_tok = len(enc["input_ids"])
    tokens = torch.full((1, max_len), pad_id, dtype=torch.long)
    tokens[0, :n_tok] = torch.tensor(enc["input_ids"])
    mask = torch.zeros(1, max_len, dtype=torch.long)
    mask[0, :n_tok] = 1
    example = (*feats, tokens, mask)
    noise = torch.randn(1, cfg.chunk_size, cfg.max_action_dim, generator=gen)
    with torch.no_grad():
        want = reference(dict(zip(order, example, strict=True)), tokens, mask, n_tok, noise.clone()).numpy()

    prefix_path = onnx_path.with_name(onnx_path.stem + ".prefix.onnx")
    with torch.no_grad():
        cached = prefix(*example)
        log(f"exporting the prefix graph ({sum(p.numel() for p in prefix.parameters()) / 1e6:.1f} M parameters in the module) to {prefix_path.name}")
        export_graph(prefix, example, prefix_path, order, outputs)
        x0 = torch.randn(1, cfg.chunk_size, cfg.max_action_dim, generator=gen)
        log(f"exporting the action expert graph to {onnx_path.name}")
        export_graph(expert, (x0, torch.tensor([[0.5]]), *cached), onnx_path, ["x_t", "t", *outputs], ["velocity"])
        del cached
    tok_name = onnx_path.stem + ".tokenizer.json"
    tokenizer.backend_tokenizer.save(str(onnx_path.with_name(tok_name)))

    log("checking ONNX Runtime's chunk (both graphs, Euler from t = 0) against LeRobot's sample_actions")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sp = ort.InferenceSession(str(prefix_path), opts, providers=["CPUExecutionProvider"])
    # A graph keeps only the inputs it reads (pi0.5's prefix reads no state).
    takes = {i.name for i in sp.get_inputs()}
    feeds = {n: x.numpy() for n, x in zip(order, example, strict=True) if n in takes}
    cache = dict(zip(outputs, sp.run(outputs, feeds), strict=True))
    del sp
    se = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    x = noise.numpy().copy()
    dt = np.float32(1.0 / steps)
    for k in range(steps):
        t = np.array([[k / steps]], dtype=np.float32)
        x = x + dt * se.run(["velocity"], {"x_t": x, "t": t, **cache})[0]
    diff = float(np.max(np.abs(x - want)))
    report = {
        "kind": "flow",
        "chunk_size": int(cfg.chunk_size),
        "temporal_ensemble_coeff": None,
        "flow_steps": steps,
        "model_action_dim": int(cfg.max_action_dim),
        "graph": {
            "sample_input": "x_t",
            "time_input": "t",
            "prefix": {"file": prefix_path.name, "outputs": outputs},
        },
        "language": {
            "tokens_input": LANG_TOKENS,
            "mask_input": LANG_MASK,
            "tokenizer": tok_name,
            "max_len": max_len,
            "pad_id": int(pad_id),
            "newline": newline_step in pre,
            # pi0.5's prompt carries the normalised state as text (reflex writes it per chunk).
            "state_prompt": state_key if "pi05_prepare_state_tokenizer_processor_step" in pre else None,
        },
    }
    return report, diff, "velocity"


def export(ckpt, onnx_path, report_path):
    t0 = time.monotonic()
    config = json.loads((ckpt / "config.json").read_text())
    ptype = config.get("type")
    if ptype not in POLICIES:
        raise Refused(f"{ckpt / 'config.json'}: policy type `{ptype}` is not supported yet ({', '.join(POLICIES)} are)")

    import importlib
    import os

    # Nothing is downloaded: a VLM's configuration and tokenizer come from a local folder or the
    # Hugging Face cache.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"

    import numpy as np
    import onnxruntime as ort
    import torch

    import lerobot

    torch.set_num_threads(1)
    log(f"LeRobot {lerobot.__version__}, torch {torch.__version__}: loading {ckpt}")
    reduced = None
    if ptype == "smolvla":
        vlm_present(ckpt, config)
    if ptype in ("pi0", "pi05"):
        tokenizer_present(ckpt)
        if os.environ.get(PI0_REDUCED_ENV):
            reduced = json.loads(Path(os.environ[PI0_REDUCED_ENV]).read_text())
            log(f"a reduced {ptype} ({PI0_REDUCED_ENV}): {reduced}")
            reduce_pi0(reduced, ptype)
    module, cls = POLICIES[ptype]
    try:
        policy = getattr(importlib.import_module(module), cls).from_pretrained(str(ckpt))
    except Exception as e:  # noqa: BLE001 - any failure here is the checkpoint's; say which file
        raise Refused(f"{ckpt / 'model.safetensors'}: LeRobot cannot load the policy from it ({type(e).__name__}: {e})") from e
    policy.eval()
    cfg = policy.config

    known = {"rename_observations_processor", "to_batch_processor", "device_processor", "normalizer_processor"}
    known_post = {"unnormalizer_processor", "device_processor"}
    if ptype in VLAS:
        known |= {f"{ptype}_new_line_processor", "tokenizer_processor"}
    if ptype == "pi05":
        known |= {"pi05_prepare_state_tokenizer_processor_step"}
    if ptype in ("pi0", "pi05"):
        # openpi's relative actions: reflex reproduces them switched off (LeRobot's default).
        known |= {"relative_actions_processor"}
        known_post |= {"absolute_actions_processor"}
    pre = pipeline_steps(ckpt, PREPROCESSOR, known)
    post = pipeline_steps(ckpt, POSTPROCESSOR, known_post)
    for where, step in ((PREPROCESSOR, pre.get("relative_actions_processor")), (POSTPROCESSOR, post.get("absolute_actions_processor"))):
        if step is not None and getattr(step, "enabled", False):
            raise Refused(f"{ckpt / where}: relative actions are enabled (use_relative_actions); reflex does not reproduce them yet")
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
    common = {
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "type": ptype,
        "n_action_steps": int(cfg.n_action_steps),
        "rename_map": rename,
        "inputs": inputs,
    }
    if reduced is not None:
        common["reduced"] = reduced
    if ptype in VLAS:
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        kind_report, diff, out_name = export_flow_vla(policy, ptype, pre, inputs, ckpt, onnx_path)
        kind_report["graph"]["output"] = out_name
        common["output"] = {"name": out_name, "feature": action_key, "shape": list(action_feat.shape), "normalize": action_norm}
        params = sum(p.numel() for p in policy.parameters())
        write_report(report_path, t0, onnx_path, diff, {**common, "parameters": params, **kind_report})
        return
    parts = None
    if ptype == "act":
        net, extra, kind_report = act_network(policy, order)
        out_name = action_key
    else:
        (net, *parts), extra, kind_report = diffusion_network(policy, order, ckpt)
        out_name = "eps" if cfg.prediction_type == "epsilon" else "sample"
    kind_report.setdefault("graph", {})["output"] = out_name
    common["output"] = {"name": out_name, "feature": action_key, "shape": list(action_feat.shape), "normalize": action_norm}
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
    if parts is not None:
        diff = export_denoiser_pair(parts, net, example, extra, order, onnx_path, out_name, kind_report)
        write_report(report_path, t0, onnx_path, diff, {**common, "parameters": params, **kind_report})
        return
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

    log("checking ONNX Runtime's output against torch's")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    with torch.no_grad():
        want = net(*example).numpy()
    got = sess.run([out_name], {n: x.numpy() for n, x in zip(names, example, strict=True)})[0]
    diff = float(np.max(np.abs(got - want)))
    write_report(report_path, t0, onnx_path, diff, {**common, "parameters": params, **kind_report})


def export_denoiser_pair(parts, net, example, extra, order, onnx_path, out_name, kind_report):
    """Writes a diffusion policy's observation encoders (`NAME.prefix.onnx`, once per chunk) and
    U-Net (`NAME.onnx`, every sampler step) and names the first in `kind_report`'s graph; returns
    how far ONNX Runtime's two graphs are from the whole module in torch."""
    import numpy as np
    import onnxruntime as ort
    import torch

    prefix, denoiser = parts
    head = [n for n, _ in extra]
    obs = example[len(head):]
    prefix_path = onnx_path.with_name(onnx_path.stem + ".prefix.onnx")
    batch = {0: "batch"}
    with torch.no_grad():
        cond = prefix(*obs)
        log(f"the observation encoders to {prefix_path.name}, the U-Net to {onnx_path.name}")
        torch.onnx.export(prefix, obs, str(prefix_path), input_names=order, output_names=["global_cond"],
                          dynamic_axes={n: batch for n in [*order, "global_cond"]}, opset_version=OPSET, dynamo=False)
        torch.onnx.export(denoiser, (*example[:len(head)], cond), str(onnx_path), input_names=[*head, "global_cond"],
                          output_names=[out_name], dynamic_axes={n: batch for n in [*head, "global_cond", out_name]},
                          opset_version=OPSET, dynamo=False)
        want = net(*example).numpy()
    kind_report["graph"]["prefix"] = {"file": prefix_path.name, "outputs": ["global_cond"]}
    log("checking ONNX Runtime's two graphs against torch's whole denoiser")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sp = ort.InferenceSession(str(prefix_path), opts, providers=["CPUExecutionProvider"])
    se = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    g = sp.run(["global_cond"], {n: x.numpy() for n, x in zip(order, obs, strict=True)})[0]
    got = se.run([out_name], {**{n: x.numpy() for n, x in zip(head, example, strict=False)}, "global_cond": g})[0]
    return float(np.max(np.abs(got - want)))


def write_report(report_path, t0, onnx_path, diff, fields):
    """Refuses an export ONNX Runtime does not reproduce; writes the report reflex reads:
    `fields` and what the export wrote."""
    import onnx

    if not diff <= CHECK_TOLERANCE:
        raise Refused(f"the exported graph's output is {diff:.3g} from torch's (tolerance {CHECK_TOLERANCE}): the export lost something")
    # The checker follows external data files, so a graph whose weights went beside it is checked
    # whole; every file the export wrote travels with the model.
    for g in sorted(onnx_path.parent.glob("*.onnx")):
        onnx.checker.check_model(str(g), full_check=False)
    files = sorted(p.name for p in onnx_path.parent.iterdir() if p.name != report_path.name)
    report = {
        "format": "reflex-lerobot-export",
        "version": 1,
        **fields,
        "opset": OPSET,
        "files": files,
        "onnx_vs_torch_max_abs": diff,
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
