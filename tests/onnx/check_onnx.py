"""python3-onnx as a consumer of qforge's ONNX export: the full checker and strict shape
inference on each model of a manifest (onnx_fixture_tool); the graph outputs' inferred shapes
must agree with the manifest's expected outputs (symbolic dims aside)."""
import json
import os
import sys

import onnx

manifest_path = sys.argv[1]
root = os.path.dirname(manifest_path)
with open(manifest_path) as f:
    manifest = json.load(f)
for m in manifest["models"]:
    path = os.path.join(root, m["file"])
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    out = inferred.graph.output[0]
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in out.type.tensor_type.shape.dim]
    want = m["expected"]["shape"]
    assert len(dims) == len(want), f"{m['name']}: output rank {dims} vs {want}"
    for d, w in zip(dims, want):
        assert isinstance(d, str) or d == w, f"{m['name']}: output dims {dims} vs {want}"
    ops = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    assert ops.get("QuantizeLinear", 0) == m["quantize_linear"], m["name"]
    assert ops.get("DequantizeLinear", 0) == m["dequantize_linear"], m["name"]
    print(f"python3-onnx {onnx.__version__}: {m['name']}: check_model(full_check=True) and strict shape inference ok, "
          f"opset {model.opset_import[0].version}, output {out.name} {dims}, "
          f"{ops.get('QuantizeLinear', 0)} QuantizeLinear, {ops.get('DequantizeLinear', 0)} DequantizeLinear")
