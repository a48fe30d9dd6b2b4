"""Writes a small chunk policy that reads two cameras named `front` and `wrist` (the names a
policy trained elsewhere gives them), with the `onnx` package, and its reflex spec.

usage: image_policy.py OUT_DIR
Writes OUT_DIR/image.onnx and OUT_DIR/image.policy.toml: each camera at 32x32, its mean
brightness per channel, a fixed linear map to a chunk of 4 two-component actions within
+-0.05 (the test environment's Box is +-0.1).
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out_dir = sys.argv[1]
T, A, SIDE = 4, 2, 32
rng = np.random.default_rng(7)
w = rng.normal(0, 1.0, size=(6, T * A)).astype(np.float32)
nodes = []
for cam in ["front", "wrist"]:
    nodes.append(helper.make_node("ReduceMean", [f"image_{cam}"], [f"mean_{cam}4"], axes=[2, 3], keepdims=0))
nodes += [
    helper.make_node("Concat", ["mean_front4", "mean_wrist4"], ["means"], axis=1),
    helper.make_node("MatMul", ["means", "w"], ["h"]),
    helper.make_node("Tanh", ["h"], ["t"]),
    helper.make_node("Mul", ["t", "scale"], ["ts"]),
    helper.make_node("Reshape", ["ts", "shape"], ["actions"]),
]
graph = helper.make_graph(
    nodes,
    "two_camera_chunk_policy",
    [helper.make_tensor_value_info(f"image_{c}", TensorProto.FLOAT, ["batch", 3, SIDE, SIDE]) for c in ["front", "wrist"]],
    [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", T, A])],
    [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(0.05, dtype=np.float32), "scale"),
        numpy_helper.from_array(np.array([-1, T, A], dtype=np.int64), "shape"),
    ],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, f"{out_dir}/image.onnx")
inputs = "".join(f"""
[[inputs]]
source = "image"
name = "image_{c}"
camera = "{c}"
width = {SIDE}
height = {SIDE}
mean = [0.5, 0.5, 0.5]
std = [0.5, 0.5, 0.5]
""" for c in ["front", "wrist"])
with open(f"{out_dir}/image.policy.toml", "w") as f:
    f.write(f"""format = "reflex-policy"
version = 1
name = "two-cameras"
kind = "chunk"
action_dim = {A}
chunk_len = {T}
execute = 2

[graph]
output = "actions"
{inputs}""")
