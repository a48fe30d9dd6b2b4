"""Parity of `reflex policy import lerobot` with LeRobot itself (`make parity`).

Builds a LeRobot 0.6.1 checkpoint (ACT, or Diffusion Policy with --policy diffusion) with
LeRobot's own classes (random weights, ResNet-18 not pretrained: nothing is downloaded) whose
features are those of reflex's simulated `pick` robot, saves it the way `lerobot-train` does (the
policy, then both processor pipelines with their statistics), imports it with reflex, and runs the
same observations (and, for a diffusion policy, the same noise) through both:

- LeRobot: `prepare_observation_for_inference` (uint8 camera frames to [0, 1], channel first),
  the checkpoint's preprocessor, the policy (ACT's `predict_action_chunk`; Diffusion Policy's
  `select_action`, whose queue holds the executed actions), the postprocessor (unnormalisation);
- reflex: `reflex policy infer` on the imported model (its spec's normalisation, its sampler,
  ONNX Runtime).

A Diffusion Policy is built with LeRobot's defaults unless told otherwise: two observation steps
(each observation comes with the step before it, which LeRobot's queue holds and reflex gets as
`past`) and DDPM with 100 steps. DDPM draws fresh noise at every step; the script records what
LeRobot's scheduler drew (diffusers' `randn_tensor`, wrapped) and hands reflex the same values
after the initial noise.

It prints the largest difference between the two chunks (in the robot's units) and each side's
time per chunk (median, one thread each: torch.set_num_threads(1), ONNX Runtime's
intra_threads = 1), writes them as JSON with --json-out, and exits 1 when the difference is
above 1e-4.

    .venv-lerobot/bin/python policies/import/parity.py --reflex target/release/reflex
    .venv-lerobot/bin/python policies/import/parity.py --policy diffusion --reflex target/release/reflex
    .venv-lerobot/bin/python policies/import/parity.py --policy diffusion --scheduler DDIM \
        --n-obs-steps 1 --inference-steps 10 --reflex target/release/reflex

SmolVLA (--policy smolvla) needs its VLM's configuration and tokenizer, which live on the
Hugging Face hub; the script makes a SmolVLM folder here instead (`local_vlm`: SmolVLM2-500M's
architecture with --vlm published, a reduced one of the same shape by default, and a tokenizer
trained here with SmolVLM's special tokens) and points the checkpoint's `vlm_model_name` at it.
LeRobot tokenises the instruction (--task-text) with its own preprocessor, reflex with the
tokenizer file the import wrote; both start from the same noise (50 x 32: SmolVLA samples the
padded action). With --bench-iters N it also writes the same network as one graph (the prefix
recomputed at every Euler step), checks it gives the two graphs' chunks, and times both with
`reflex policy bench --json`.

    .venv-lerobot/bin/python policies/import/parity.py --policy smolvla --vlm published \
        --observations 1 --warmup 0 --repeat 1 --bench-iters 3 --reflex target/release/reflex

pi0 and pi0.5 (--policy pi0, --policy pi05) are built with LeRobot's own classes from its
published Gemma variants redefined two layers deep (REDUCED_PI0, through the exporter's
REFLEX_PI0_REDUCED, which LeRobot's run here and the import share: the published 3.3 B do not
load in 24 GB), with a PaliGemma-like tokenizer trained here in a Hugging Face cache made for the
run (`local_paligemma_tokenizer`).

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
VLAS = ("smolvla", "pi0", "pi05")


def sh(cmd, **kw):
    print("$ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


# SmolVLM2-500M-Video-Instruct, the VLM SmolVLA is built on (its config.json on the Hugging Face
# hub): a SigLIP vision tower at 512 px and a 32-layer, 960-wide SmolLM2 of which SmolVLA keeps
# the first 16 layers (num_vlm_layers).
PUBLISHED_VLM = {
    "vision": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=512, patch_size=16),
    "text": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                 head_dim=64, vocab_size=49280, rope_theta=100000.0, max_position_embeddings=8192, rms_norm_eps=1e-5),
    "scale_factor": 4,
}
# The same architecture, small enough for a parity check in seconds: a 64 px vision tower, a
# 4-layer, 128-wide language model (the expert 0.75 of it, cross-attention every other layer).
REDUCED_VLM = {
    "vision": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=16),
    "text": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, rms_norm_eps=1e-5),
    "scale_factor": 2,
}


def robot_bpe(specials, unk=None):
    """A byte-level BPE (400 tokens) trained here on robot instructions, `specials` first at ids
    0.., `unk` its unknown token: the stand-in for a hub tokenizer nothing here downloads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "pick up the cube and place it on the target\n", "pick up the red cube\n", "insert the peg into the hole\n",
        "push the block to the left\n", "open the drawer, then close it\n", "stack the blocks\n",
    ] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def local_vlm(out, size):
    """A SmolVLM model folder made here, as `vlm_model_name` points SmolVLA at: its config.json
    (the `size` architecture) and a processor whose tokenizer is a byte-level BPE trained here on
    robot instructions with SmolVLM's special tokens (SmolVLM's own tokenizer is on the hub, which
    nothing here downloads from). SmolVLA's weights are random either way."""
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
    tok = robot_bpe(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", bos_token="<|im_start|>",
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
            "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    arch = PUBLISHED_VLM if size == "published" else REDUCED_VLM
    text = {"model_type": "llama", "vocab_size": len(fast), **arch["text"]}
    cfg = SmolVLMConfig(vision_config=arch["vision"], text_config=text, scale_factor=arch["scale_factor"],
                        image_token_id=fast.convert_tokens_to_ids("<image>"))
    cfg.save_pretrained(out)
    side = arch["vision"]["image_size"]
    proc = SmolVLMProcessor(
        image_processor=SmolVLMImageProcessor(size={"longest_edge": side}, max_image_size={"longest_edge": side}),
        tokenizer=fast, video_processor=SmolVLMVideoProcessor(),
    )
    proc.save_pretrained(out)
    return side


# pi0 reduced to run here (LeRobot builds only its published 3.3 B variants; built with them it
# takes 17.6 GB before its weights load, which this 24 GB machine cannot also hold): two layers
# of each Gemma and of the SigLIP tower, the MLPs narrower; widths, heads, head size, the
# 257,152-token vocabulary and the 224 px images as published (LeRobot's code fixes them).
REDUCED_PI0 = {
    "variants": {
        "gemma_2b": dict(width=2048, depth=2, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=256),
        "gemma_300m": dict(width=1024, depth=2, mlp_dim=1024, num_heads=8, num_kv_heads=1, head_dim=256),
    },
    "vision_layers": 2,
}
PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"


def local_paligemma_tokenizer(hf_home):
    """A tokenizer where pi0's tokenizer step looks for PaliGemma's (`google/paligemma-3b-pt-224`
    in the Hugging Face cache under `hf_home`, as a download leaves it): a byte-level BPE trained
    here with Gemma's special tokens at Gemma's ids (<pad> 0, <eos> 1, <bos> 2) and, as Gemma's,
    <bos> put before every text. PaliGemma's own tokenizer is gated on the hub, which nothing
    here downloads from."""
    from tokenizers import processors
    from transformers import PaliGemmaConfig, PreTrainedTokenizerFast

    tok = robot_bpe(["<pad>", "<eos>", "<bos>", "<unk>"], unk="<unk>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")
    revision = "0" * 40
    repo = Path(hf_home) / "hub" / ("models--" + PALIGEMMA_TOKENIZER.replace("/", "--"))
    fast.save_pretrained(repo / "snapshots" / revision)
    # transformers 5's AutoTokenizer reads the model's configuration first, as the hub repo has.
    PaliGemmaConfig().save_pretrained(repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)


def make_checkpoint(out, robot, a):
    """A checkpoint of policy `a.policy` for `robot` as lerobot-train saves one, with random weights
    and statistics; returns its image feature keys with the robot camera each reads, the
    statistics and the parameter count."""
    import torch

    from lerobot.configs.types import FeatureType, PolicyFeature

    torch.manual_seed(a.seed)
    state_dim = sum(f["size"] for f in robot["state"])
    action_dim = len(robot["action"]["names"])
    cams = robot["cameras"]
    # The first camera under another name (mapped with --map), the others under their own.
    keys = {("observation.images.top" if i == 0 else f"observation.images.{c['name']}"): c for i, c in enumerate(cams)}
    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,))}
    for k, c in keys.items():
        inputs[k] = PolicyFeature(FeatureType.VISUAL, (3, c["height"], c["width"]))
    common = dict(
        input_features=inputs,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))},
        pretrained_backbone_weights=None,
        device="cpu",
    )
    if a.policy == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
        from lerobot.policies.smolvla.processor_smolvla import make_smolvla_pre_post_processors as make_processors

        vlm = out.parent / f"smolvlm-{a.vlm}"
        side = local_vlm(vlm, a.vlm)
        del common["pretrained_backbone_weights"]
        # LeRobot's defaults but the backbone: chunk 50, all executed, 10 Euler steps, state and
        # actions padded to 32, images resized with padding to the vision tower's size.
        cfg = SmolVLAConfig(**common, vlm_model_name=str(vlm), resize_imgs_with_padding=(side, side),
                            chunk_size=a.chunk_size, n_action_steps=a.n_action_steps)
        policy = SmolVLAPolicy(cfg)
    elif a.policy == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy
        from lerobot.policies.pi0.processor_pi0 import make_pi0_pre_post_processors as make_processors

        del common["pretrained_backbone_weights"]
        # LeRobot's defaults: chunk 50, all executed, 10 Euler steps, state and actions padded
        # to 32, images resized with padding to 224, the instruction padded to 48 tokens.
        cfg = PI0Config(**common, chunk_size=a.chunk_size, n_action_steps=a.n_action_steps)
        policy = PI0Policy(cfg)
    elif a.policy == "pi05":
        from lerobot.policies.pi05.configuration_pi05 import PI05Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy
        from lerobot.policies.pi05.processor_pi05 import make_pi05_pre_post_processors as make_processors

        del common["pretrained_backbone_weights"]
        # LeRobot's defaults: as pi0, but state and actions normalised by quantiles, the state
        # written into the prompt (padded to 200 tokens), the time through adaRMS.
        cfg = PI05Config(**common, chunk_size=a.chunk_size, n_action_steps=a.n_action_steps)
        policy = PI05Policy(cfg)
    elif a.policy == "act":
        from lerobot.policies.act.configuration_act import ACTConfig
        from lerobot.policies.act.modeling_act import ACTPolicy
        from lerobot.policies.act.processor_act import make_act_pre_post_processors as make_processors

        cfg = ACTConfig(**common, chunk_size=a.chunk_size, n_action_steps=a.n_action_steps)
        policy = ACTPolicy(cfg)
    else:
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
        from lerobot.policies.diffusion.processor_diffusion import (
            make_diffusion_pre_post_processors as make_processors,
        )

        # LeRobot's defaults unless told: n_obs_steps 2, DDPM. The U-Net at Diffusion Policy's
        # published width (256/512/1024), an in-graph centre crop as LeRobot evaluates it.
        cfg = DiffusionConfig(
            **common,
            n_obs_steps=a.n_obs_steps,
            horizon=a.chunk_size,
            n_action_steps=a.n_action_steps,
            noise_scheduler_type=a.scheduler,
            num_inference_steps=a.inference_steps,
            down_dims=(256, 512, 1024),
            crop_shape=(112, 112),
        )
        policy = DiffusionPolicy(cfg)

    def vector_stats(n):
        low = torch.randn(n) - 1.0 - torch.rand(n)
        mean = torch.randn(n)
        std = torch.rand(n) + 0.5
        return {
            "mean": mean,
            "std": std,
            "min": low,
            "max": low + 2.0 * torch.rand(n) + 0.5,
            # Quantiles about the mean, so pi0.5's discretised state spans its bins.
            "q01": mean - 2.3 * std,
            "q99": mean + 2.3 * std,
            "q10": mean - 1.3 * std,
            "q90": mean + 1.3 * std,
        }

    # Of order one, so a wrong statistic or formula shows far above the tolerance; every
    # statistic LeRobot's compute_stats writes, whichever mode the policy normalises with.
    stats = {"observation.state": vector_stats(state_dim), "action": vector_stats(action_dim)}
    # Per channel, shaped (3, 1, 1) as LeRobot's compute_stats writes image statistics.
    for k in keys:
        stats[k] = {
            "mean": torch.rand(3, 1, 1) * 0.4 + 0.3,
            "std": torch.rand(3, 1, 1) * 0.2 + 0.1,
            "min": torch.zeros(3, 1, 1),
            "max": torch.ones(3, 1, 1),
        }
    pre, post = make_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    params = sum(p.numel() for p in policy.parameters())
    return {k: c["name"] for k, c in keys.items()}, stats, params


def observations(robot, stats, a, action_dim):
    """Observations: states drawn around the checkpoint's statistics, random camera frames, for a
    diffusion policy the initial noise both sides start from, and the observations of the steps
    before each one that a policy with a history reads (oldest first; none for ACT)."""
    import numpy as np

    rng = np.random.default_rng(a.seed + 1)
    mean = stats["observation.state"]["mean"].numpy()
    std = stats["observation.state"]["std"].numpy()

    def frame():
        state = (mean + std * rng.standard_normal(mean.shape)).astype(np.float32)
        images = {c["name"]: rng.integers(0, 256, (c["height"], c["width"], 3), dtype=np.uint8) for c in robot["cameras"]}
        return state, images

    past_steps = a.n_obs_steps - 1 if a.policy == "diffusion" else 0
    out = []
    for _ in range(a.observations):
        state, images = frame()
        width = 32 if a.policy in VLAS else action_dim  # a flow VLA samples max_action_dim
        noise = rng.standard_normal((a.chunk_size, width)).astype(np.float32) if a.policy != "act" else None
        out.append((state, images, noise, [frame() for _ in range(past_steps)]))
    return out


def lerobot_chunks(ckpt, cams, obs, a):
    """LeRobot's chunks as its rollout makes them: the frame converted by
    `prepare_observation_for_inference`, the preprocessor, the policy, the postprocessor. ACT's
    whole chunk from `predict_action_chunk`; a diffusion policy's executed part from
    `select_action` (its queue of n_action_steps actions), started from the given noise, its
    observation queue holding the past observations first (as `select_action` fills it step by
    step). Returns the chunks, the median time per chunk and, per observation, the noise DDPM's
    scheduler drew at its steps (empty for DDIM and ACT)."""
    import diffusers.schedulers.scheduling_ddpm as ddpm
    import torch

    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.utils import populate_queues, prepare_observation_for_inference
    from lerobot.utils.constants import OBS_IMAGES

    drawn = []
    randn = ddpm.randn_tensor

    def recording_randn(*args, **kw):
        z = randn(*args, **kw)
        drawn.append(z.detach().clone())
        return z

    ddpm.randn_tensor = recording_randn

    if a.policy == "act":
        from lerobot.policies.act.modeling_act import ACTPolicy as Policy
    elif a.policy == "smolvla":
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy as Policy
    elif a.policy == "pi0":
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    elif a.policy == "pi05":
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy
    else:
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy as Policy

    policy = Policy.from_pretrained(str(ckpt))
    policy.eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(ckpt))
    def batch_of(state, images):
        frame = {"observation.state": state.copy()}
        for key, cam in cams.items():
            frame[key] = images[cam].copy()
        return pre(prepare_observation_for_inference(frame, torch.device("cpu"), task=a.task_text if a.policy in VLAS else None))

    chunks, times, step_noise = [], [], []
    for state, images, noise, past in obs:
        t = []
        for r in range(a.warmup + a.repeat):
            t0 = time.perf_counter()
            batch = batch_of(state, images)
            drawn.clear()
            with torch.no_grad():
                if a.policy == "act":
                    actions = policy.predict_action_chunk(batch)[0]
                elif a.policy in VLAS:
                    actions = policy.predict_action_chunk(batch, noise=torch.from_numpy(noise)[None])[0]
                else:
                    policy.reset()
                    for ps, pi in past:
                        # As select_action: no action key, the cameras stacked, then queued.
                        pb = {k: v for k, v in batch_of(ps, pi).items() if k != "action"}
                        pb[OBS_IMAGES] = torch.stack([pb[k] for k in policy.config.image_features], dim=-4)
                        policy._queues = populate_queues(policy._queues, pb)
                    first = policy.select_action(batch, noise=torch.from_numpy(noise)[None])
                    actions = torch.cat([first, *list(policy._queues["action"])], dim=0)
            actions = post(actions)
            dt = time.perf_counter() - t0
            if r >= a.warmup:
                t.append(dt * 1e6)
            if r == 0:
                chunks.append(actions.numpy())
                step_noise.append([z.numpy().reshape(-1) for z in drawn])
        times.append(sorted(t)[len(t) // 2])
    ddpm.randn_tensor = randn
    return chunks, times, step_noise


def single_graph(ckpt, model):
    """SmolVLA as one graph, the way docs/bring-your-own-policy.md used to export a flow VLA: the
    observation and the noisy chunk in, the velocity out, so the prefix (vision, language, the
    VLM's layers) runs again at every Euler step. Written beside the imported model with the
    same spec less its prefix graph, for `reflex policy bench` to time against the two graphs."""
    import re

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import lerobot_export as lx
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    policy = SmolVLAPolicy.from_pretrained(str(ckpt)).eval()
    cfg = policy.config
    image_keys = list(cfg.image_features)
    order = [*cfg.input_features, lx.LANG_TOKENS, lx.LANG_MASK]
    prefix, expert = lx.smolvla_graphs(policy, order, image_keys, "observation.state")

    class Single(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.prefix, self.expert = prefix, expert

        def forward(self, *xs):
            return self.expert(xs[-2], xs[-1], *self.prefix(*xs[:-2]))

    gen = torch.Generator().manual_seed(0)
    feats = [torch.rand(1, *f.shape, generator=gen) for f in cfg.input_features.values()]
    tokens = torch.zeros(1, cfg.tokenizer_max_length, dtype=torch.long)
    mask = torch.ones(1, cfg.tokenizer_max_length, dtype=torch.long)
    x = torch.randn(1, cfg.chunk_size, cfg.max_action_dim, generator=gen)
    width, height = cfg.resize_imgs_with_padding
    lx.export_patches(policy.model.vlm_with_expert.get_vlm_model().vision_model, height, width)
    out = model.with_name(model.stem.replace("-parity", "") + "-single-graph.onnx")
    with torch.no_grad():
        torch.onnx.export(Single().eval(), (*feats, tokens, mask, x, torch.tensor([[0.5]])), str(out),
                          input_names=[*order, "x_t", "t"], output_names=["velocity"], opset_version=lx.OPSET, dynamo=False)
    spec = model.parent / (model.stem + ".policy.toml")
    text = re.sub(r"\[graph\.prefix\]\n.*?\n\]\n", "", spec.read_text(), flags=re.S)
    (out.parent / (out.stem + ".policy.toml")).write_text(text.replace(f'name = "{model.stem}"', f'name = "{out.stem}"', 1))
    return out


def bench(reflex, model, iters):
    """`reflex policy bench --json` on `model`: its report."""
    out = sh([reflex, "policy", "bench", "--model", model, "--iters", iters, "--json"], capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reflex", type=Path, required=True, help="the reflex binary")
    ap.add_argument("--policy", choices=["act", "diffusion", "smolvla", "pi0", "pi05"], default="act")
    ap.add_argument("--vlm", choices=["reduced", "published"], default="reduced",
                    help="SmolVLA's backbone: SmolVLM2-500M's architecture, or a reduced one of the same shape (default)")
    ap.add_argument("--task-text", default="pick up the cube and place it on the target", help="a VLA's instruction (SmolVLA, pi0)")
    ap.add_argument("--task", default="pick", help="the simulated robot (sim/<task>)")
    ap.add_argument("--work", type=Path, help="folder for the checkpoint, model and files (default: temporary)")
    ap.add_argument("--observations", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-size", type=int, help="ACT's chunk_size (default LeRobot's, 100), Diffusion Policy's horizon (16)")
    ap.add_argument("--n-action-steps", type=int, help="default: the chunk for ACT, 8 for Diffusion Policy")
    ap.add_argument("--inference-steps", type=int, help="Diffusion Policy's sampler steps (default LeRobot's: the 100 training steps)")
    ap.add_argument("--n-obs-steps", type=int, default=2, help="Diffusion Policy's observation steps (LeRobot's default, 2)")
    ap.add_argument("--scheduler", choices=["DDPM", "DDIM"], default="DDPM", help="Diffusion Policy's sampler (LeRobot's default, DDPM)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--bench-iters", type=int, default=0,
                    help="SmolVLA: also time the imported two graphs and the same network as one graph with "
                         "`reflex policy bench --json` (this many chunks each; 0: no)")
    a = ap.parse_args()
    if a.chunk_size is None:
        a.chunk_size = {"act": 100, "diffusion": 16, "smolvla": 50, "pi0": 50, "pi05": 50}[a.policy]
    if a.n_action_steps is None:
        a.n_action_steps = 8 if a.policy == "diffusion" else a.chunk_size

    import numpy as np
    import torch

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

    if a.policy in ("pi0", "pi05"):
        # PaliGemma's tokenizer from a Hugging Face cache made here, for LeRobot and the importer
        # alike; the reduced variants for both (lerobot_export.PI0_REDUCED_ENV).
        sys.path.insert(0, str(Path(__file__).parent))
        import lerobot_export as lx

        os.environ["HF_HOME"] = str(a.work / "hf")
        os.environ["HF_HUB_OFFLINE"] = "1"
        local_paligemma_tokenizer(a.work / "hf")
        reduced = a.work / "pi0-reduced.json"
        reduced.write_text(json.dumps(REDUCED_PI0))
        os.environ[lx.PI0_REDUCED_ENV] = str(reduced)
        lx.reduce_pi0(REDUCED_PI0, a.policy)
    import lerobot

    robot = json.loads(sh([reflex, "sim", "spec", "--task", a.task, "--cameras"], capture_output=True, text=True).stdout)
    ckpt = a.work / "pretrained_model"
    cams, stats, params = make_checkpoint(ckpt, robot, a)
    model = a.work / "models" / f"{a.policy}-parity.onnx"
    maps = [arg for k, cam in cams.items() if not k.endswith("." + cam) for arg in ("--map", f"{k}={cam}")]
    t0 = time.monotonic()
    task = ["--task", a.task_text] if a.policy in VLAS else []
    sh([reflex, "policy", "import", "lerobot", ckpt, "--out", model, "--robot-kind", f"sim/{a.task}",
        "--tools-env", sys.prefix, *maps, *task])
    import_s = time.monotonic() - t0

    action_dim = len(robot["action"]["names"])
    obs = observations(robot, stats, a, action_dim)
    # LeRobot first: DDPM's per-step noise is what its scheduler draws, handed to reflex after.
    theirs, lerobot_us, drawn = lerobot_chunks(ckpt, cams, obs, a)

    def frame_json(s, images):
        return {"state": s.tolist(), "images": [
            {"camera": cam, "width": int(img.shape[1]), "height": int(img.shape[0]), "rgb8": img.reshape(-1).tolist()}
            for cam, img in images.items()]}

    entries = []
    for (s, images, n, past), steps in zip(obs, drawn, strict=True):
        e = frame_json(s, images)
        if n is not None:
            e["noise"] = np.concatenate([n.reshape(-1), *steps]).tolist()
        if past:
            e["past"] = [frame_json(ps, pi) for ps, pi in past]
        entries.append(e)
    obs_file = a.work / "observations.json"
    obs_file.write_text(json.dumps({"observations": entries}))
    out = sh([reflex, "policy", "infer", "--model", model, "--observations", obs_file,
              "--warmup", a.warmup, "--repeat", a.repeat], capture_output=True, text=True).stdout
    ours = json.loads(out)

    # LeRobot's diffusion policy hands out only the executed part (n_action_steps from row
    # n_obs_steps - 1); reflex's chunk starts at that row (first_action) and runs to the horizon.
    diffs = [
        float(np.max(np.abs(np.asarray(r, dtype=np.float32)[: len(l)] - l)))
        for r, l in zip(ours["chunks"], theirs, strict=True)
    ]
    scale = float(max(np.max(np.abs(l)) for l in theirs))
    figures = {
        "task": a.task,
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "policy": a.policy,
        "parameters_m": round(params / 1e6, 1),
        "chunk_size": a.chunk_size,
        "compared_actions": int(len(theirs[0])),
        "inference_steps": (a.inference_steps or 100) if a.policy == "diffusion" else None,
        "scheduler": a.scheduler if a.policy == "diffusion" else None,
        "n_obs_steps": a.n_obs_steps if a.policy == "diffusion" else None,
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
    if a.policy == "smolvla" and a.bench_iters > 0:
        figures["bench_two_graphs"] = bench(reflex, model, a.bench_iters)
        single = single_graph(ckpt, model)
        # The one graph computes what the two do: the same chunks on the same observations.
        out = sh([reflex, "policy", "infer", "--model", single, "--observations", obs_file], capture_output=True, text=True).stdout
        figures["single_vs_two_graphs_max_abs"] = float(max(
            np.max(np.abs(np.asarray(x, dtype=np.float32) - np.asarray(y, dtype=np.float32)))
            for x, y in zip(json.loads(out)["chunks"], ours["chunks"], strict=True)))
        figures["bench_single_graph"] = bench(reflex, single, a.bench_iters)
    print(json.dumps(figures, indent=1))
    if a.json_out:
        a.json_out.write_text(json.dumps(figures, indent=1) + "\n")
    ok = figures["max_abs_diff"] <= TOLERANCE
    print(
        f"{a.policy} on sim/{a.task} ({figures['parameters_m']} M parameters, chunk {a.chunk_size}, cameras {figures['cameras']}): "
        f"reflex vs LeRobot max |diff| {figures['max_abs_diff']:.2e} over {a.observations} observations "
        f"(actions up to {scale:.3g}) {'<=' if ok else '>'} {TOLERANCE}; per chunk, 1 thread: "
        f"reflex {figures['reflex_chunk_us_p50'] / 1e3:.1f} ms, LeRobot {figures['lerobot_chunk_us_p50'] / 1e3:.1f} ms",
        file=sys.stderr,
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
