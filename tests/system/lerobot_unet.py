"""Builds a diffusion UNet the way LeRobot's DiffusionPolicy exports it, with the `onnx` package (no
reflex code), writes it with a reflex spec, and samples it with DDIM (or DDPM) in numpy +
onnxruntime.

The network follows lerobot/policies/diffusion/modeling_diffusion.py (DiffusionConditionalUnet1d):
- the noisy chunk [B, T, A] is transposed to [B, A, T]; the timestep is int64 [B];
- the timestep goes through a sinusoidal embedding computed in the graph (half sin, half cos,
  frequencies exp(-log(10000) k / (half - 1))), Linear, Mish, Linear;
- the global conditioning is the timestep embedding concatenated with the stacked, normalised
  state of the last n_obs_steps observations;
- residual blocks Conv1d -> GroupNorm -> Mish, twice, with FiLM (scale and bias from
  Mish -> Linear of the conditioning) after the first, and a 1x1 conv on the skip when the
  widths differ; down with a stride-2 Conv1d, up with a ConvTranspose1d (4, 2, 1), skips
  concatenated on the way up; a final Conv1d block and a 1x1 Conv1d to the action width.
GroupNorm is written as torch.onnx writes it below opset 18: Reshape -> InstanceNormalization ->
Reshape -> affine. Mish is x * tanh(softplus(x)).

The sampler is diffusers' DDIMScheduler as LeRobot configures it (squaredcos_cap_v2 betas,
epsilon prediction, clip_sample 1.0, set_alpha_to_one, "leading" spacing, eta = 0), written here
from its formulas in float64. With `ddpm` it is diffusers' DDPMScheduler as LeRobot configures it
by default (the same betas, clipping and spacing; `fixed_small` variance: each step but the last
adds sqrt((1 - abar_prev) / (1 - abar_t) * beta_t) times fresh standard normal noise, drawn here
and printed as `step_noise`), and the spec executes from row 1 (`first_action`, LeRobot's
n_obs_steps - 1).

usage: lerobot_unet.py OUT_DIR STATE_JSON NOISE_SEED [ddpm]
prints JSON: {"noise": [...], "steps": [[sample after step 1], ...], "timesteps": [...],
              "step_noise": [[...], ...] (DDPM)}
"""
import json
import math
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

out_dir, state, noise_seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
DDPM = sys.argv[4:] == ["ddpm"]
S = len(state)
T, A, N_OBS = 8, 2, 2  # horizon, action dim, observation steps
DOWN = [16, 32]
K, GROUPS, EMB = 3, 4, 16
TRAIN_STEPS, INFER_STEPS = 100, 10
LOW, HIGH = [-2.0] * S, [2.0] * S

rng = np.random.default_rng(7)
nodes, inits = [], []
counter = [0]


def fresh(hint):
    counter[0] += 1
    return f"{hint}_{counter[0]}"


def const(hint, arr, dtype=np.float32):
    name = fresh(hint)
    inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype), name))
    return name


def op(kind, inputs, **attrs):
    out = fresh(kind.lower())
    nodes.append(helper.make_node(kind, inputs, [out], **attrs))
    return out


def param(*shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    s = scale if scale is not None else 1.0 / math.sqrt(fan_in)
    return rng.uniform(-s, s, size=shape).astype(np.float32)


def linear(x, n_in, n_out):  # x [B, n_in]
    w = const("w", param(n_out, n_in).T.copy())
    b = const("b", param(n_out, scale=0.1))
    return op("Add", [op("MatMul", [x, w]), b])


def mish(x):
    return op("Mul", [x, op("Tanh", [op("Softplus", [x])])])


def conv1d(x, c_in, c_out, k, stride=1, pad=None):
    pad = k // 2 if pad is None else pad
    w = const("conv_w", param(c_out, c_in, k))
    b = const("conv_b", param(c_out, scale=0.1))
    return op("Conv", [x, w, b], kernel_shape=[k], pads=[pad, pad], strides=[stride])


def group_norm(x, c):
    g = op("Reshape", [x, const("shape", [0, GROUPS, -1], np.int64)])
    n = op("InstanceNormalization", [g, const("ones", np.ones(GROUPS)), const("zeros", np.zeros(GROUPS))], epsilon=1e-5)
    back = op("Reshape", [n, op("Shape", [x])])
    gamma = const("gamma", 1.0 + param(c, 1, scale=0.2))
    beta = const("beta", param(c, 1, scale=0.2))
    return op("Add", [op("Mul", [back, gamma]), beta])


def conv_block(x, c_in, c_out):
    return mish(group_norm(conv1d(x, c_in, c_out, K), c_out))


def res_block(x, c_in, c_out, cond, cond_dim):
    out = conv_block(x, c_in, c_out)
    film = op("Unsqueeze", [linear(mish(cond), cond_dim, 2 * c_out), const("axis", [2], np.int64)])
    axis1 = const("axis", [1], np.int64)
    scale = op("Slice", [film, const("s", [0], np.int64), const("e", [c_out], np.int64), axis1])
    bias = op("Slice", [film, const("s", [c_out], np.int64), const("e", [2 * c_out], np.int64), axis1])
    out = op("Add", [op("Mul", [scale, out]), bias])
    out = conv_block(out, c_out, c_out)
    skip = conv1d(x, c_in, c_out, 1) if c_in != c_out else x
    return op("Add", [out, skip])


# Timestep embedding, in the graph.
half = EMB // 2
freqs = np.exp(np.arange(half) * -(math.log(10000) / (half - 1))).astype(np.float32)
t = op("Unsqueeze", [op("Cast", ["timestep"], to=TensorProto.FLOAT), const("axis", [1], np.int64)])
angle = op("Mul", [t, const("freqs", freqs[None, :])])
emb = op("Concat", [op("Sin", [angle]), op("Cos", [angle])], axis=-1)
t_emb = linear(mish(linear(emb, EMB, 4 * EMB)), 4 * EMB, EMB)
cond = op("Concat", [t_emb, "global_cond"], axis=-1)
cond_dim = EMB + S * N_OBS

x = op("Transpose", ["sample"], perm=[0, 2, 1])
dims = [A] + DOWN
skips = []
for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:])):
    last = i == len(DOWN) - 1  # no downsampling after the widest level
    x = res_block(x, c_in, c_out, cond, cond_dim)
    x = res_block(x, c_out, c_out, cond, cond_dim)
    skips.append(x)
    if not last:
        x = conv1d(x, c_out, c_out, 3, stride=2, pad=1)
for _ in range(2):
    x = res_block(x, DOWN[-1], DOWN[-1], cond, cond_dim)
in_out = [(A, DOWN[0])] + list(zip(DOWN[:-1], DOWN[1:]))
for i, (d_in, d_out) in enumerate(reversed(in_out[1:])):
    last = i >= len(in_out) - 1
    x = op("Concat", [x, skips.pop()], axis=1)
    x = res_block(x, 2 * d_out, d_in, cond, cond_dim)
    x = res_block(x, d_in, d_in, cond, cond_dim)
    if not last:
        w = const("convT_w", param(d_in, d_in, 4))
        x = op("ConvTranspose", [x, w, const("convT_b", param(d_in, scale=0.1))], kernel_shape=[4], strides=[2], pads=[1, 1])
x = conv_block(x, DOWN[0], DOWN[0])
x = conv1d(x, DOWN[0], A, 1)
nodes.append(helper.make_node("Transpose", [x], ["noise_pred"], perm=[0, 2, 1]))

graph = helper.make_graph(
    nodes,
    "lerobot_shaped_unet",
    [
        helper.make_tensor_value_info("sample", TensorProto.FLOAT, ["batch", T, A]),
        helper.make_tensor_value_info("timestep", TensorProto.INT64, ["batch"]),
        helper.make_tensor_value_info("global_cond", TensorProto.FLOAT, ["batch", S * N_OBS]),
    ],
    [helper.make_tensor_value_info("noise_pred", TensorProto.FLOAT, ["batch", T, A])],
    inits,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, f"{out_dir}/unet.onnx")
with open(f"{out_dir}/unet.policy.toml", "w") as f:
    f.write(f"""format = "reflex-policy"
version = 1
name = "lerobot-shaped diffusion unet"
kind = "diffusion"
action_dim = {A}
chunk_len = {T}
execute = {T // 2}
{f"first_action = {N_OBS - 1}" if DDPM else ""}

[graph]
sample_input = "sample"
time_input = "timestep"
time_dtype = "int64"
time_shape = "batch"
output = "noise_pred"

[[inputs]]
source = "state"
name = "global_cond"
history = {N_OBS}
normalize = {{ kind = "min_max", low = {LOW}, high = {HIGH} }}

[diffusion]
train_steps = {TRAIN_STEPS}
inference_steps = {INFER_STEPS}
schedule = "squaredcos_cap_v2"
clip_sample = 1.0
prediction = "epsilon"
""" + ('sampler = "ddpm"\n' if DDPM else ""))


# diffusers' DDIMScheduler, as LeRobot configures it.
def alpha_bar(t):
    return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2


betas = np.array([min(1 - alpha_bar((i + 1) / TRAIN_STEPS) / alpha_bar(i / TRAIN_STEPS), 0.999) for i in range(TRAIN_STEPS)])
alphas_cumprod = np.cumprod(1.0 - betas)
ratio = TRAIN_STEPS // INFER_STEPS
timesteps = (np.arange(0, INFER_STEPS) * ratio).round()[::-1].astype(np.int64)

norm = [2 * (s - lo) / (hi - lo) - 1 for s, lo, hi in zip(state, LOW, HIGH)]
global_cond = np.array([norm * N_OBS], dtype=np.float32)  # the first observation, repeated
noise = np.random.default_rng(noise_seed).standard_normal((1, T, A)).astype(np.float32)
session = ort.InferenceSession(f"{out_dir}/unet.onnx", providers=["CPUExecutionProvider"])
x = noise.astype(np.float64)
steps, step_noise = [], []
rng = np.random.default_rng(noise_seed + 1)
for t in timesteps:
    eps = session.run(["noise_pred"], {"sample": x.astype(np.float32), "timestep": np.array([t], dtype=np.int64), "global_cond": global_cond})[0].astype(np.float64)
    prev = t - ratio
    a_t = alphas_cumprod[t]
    a_prev = alphas_cumprod[prev] if prev >= 0 else 1.0
    x0 = np.clip((x - math.sqrt(1 - a_t) * eps) / math.sqrt(a_t), -1.0, 1.0)
    if DDPM:
        alpha = a_t / a_prev
        beta = 1 - alpha
        x = math.sqrt(a_prev) * beta / (1 - a_t) * x0 + math.sqrt(alpha) * (1 - a_prev) / (1 - a_t) * x
        if t > 0:
            z = rng.standard_normal((1, T, A)).astype(np.float32)
            step_noise.append(z.ravel().tolist())
            x = x + math.sqrt(max((1 - a_prev) / (1 - a_t) * beta, 1e-20)) * z.astype(np.float64)
    else:
        x = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps
    steps.append(x.astype(np.float32).ravel().tolist())
print(json.dumps({"noise": noise.ravel().tolist(), "steps": steps, "timesteps": timesteps.tolist(), "step_noise": step_noise}))
