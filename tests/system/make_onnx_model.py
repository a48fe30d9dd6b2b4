"""Builds a chunk policy with the `onnx` package (no reflex code involved), writes it with its
reflex spec, and prints what the `onnxruntime` Python package computes for a given state.

usage: make_onnx_model.py [--external] [--nan] OUT_DIR STATE_JSON [GAIN]
With GAIN, the graph has a second input `gain` (float32 [batch, 1]) that scales its output, and
the spec feeds it as a constant. With --external the weight matrix `w` (the one tensor of 100
bytes or more) is saved as ONNX external data in `py.onnx.data` beside the model, as
torch.onnx.export does for large models; the reshape target must stay inline, where shape
inference reads it. With --nan one weight is NaN (what a diverged training leaves).
"""
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

flags = {a for a in sys.argv[1:] if a.startswith("--")}
args = [a for a in sys.argv[1:] if not a.startswith("--")]
out_dir, state = args[0], json.loads(args[1])
gain = float(args[2]) if len(args) > 2 else None
S, T, A = len(state), 4, 3
rng = np.random.default_rng(42)
w = rng.normal(0, 0.5, size=(S, T * A)).astype(np.float32)
b = rng.normal(0, 0.1, size=(T * A,)).astype(np.float32)
if "--nan" in flags:
    w[0, 0] = np.nan
graph = helper.make_graph(
    [
        helper.make_node("MatMul", ["state", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Tanh", ["hb"], ["t0"]),
        helper.make_node("Mul" if gain is not None else "Identity", ["t0", "gain"] if gain is not None else ["t0"], ["t"]),
        helper.make_node("Reshape", ["t", "shape"], ["actions"]),
    ],
    "python_chunk_policy",
    [helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", S])]
    + ([helper.make_tensor_value_info("gain", TensorProto.FLOAT, ["batch", 1])] if gain is not None else []),
    [helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["batch", T, A])],
    [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array([-1, T, A], dtype=np.int64), "shape")],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
if "--external" in flags:
    onnx.save(model, f"{out_dir}/py.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="py.onnx.data", size_threshold=100)
else:
    onnx.save(model, f"{out_dir}/py.onnx")
with open(f"{out_dir}/py.policy.toml", "w") as f:
    f.write(f"""format = "reflex-policy"
version = 1
name = "python-built"
kind = "chunk"
action_dim = {A}
chunk_len = {T}
execute = 2

[graph]
output = "actions"

[[inputs]]
source = "state"
name = "state"
""" + ("" if gain is None else f"""
[[inputs]]
source = "constant"
name = "gain"
dtype = "float32"
shape = [1]
values = [{gain}]
"""))
sess = ort.InferenceSession(f"{out_dir}/py.onnx", providers=["CPUExecutionProvider"])
feeds = {"state": np.asarray([state], dtype=np.float32)}
if gain is not None:
    feeds["gain"] = np.asarray([[gain]], dtype=np.float32)
(y,) = sess.run(["actions"], feeds)
print(json.dumps([float(v) for v in y.ravel()]))
