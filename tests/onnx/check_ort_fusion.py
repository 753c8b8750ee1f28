"""ONNX Runtime's QDQ fusions on qforge's export (ctest onnx_consumers, docs/onnx.md "ONNX Runtime"):
reads the graphs ORT optimised and saved (run_ort.js, mode "extended") and checks that every
MatMul / Gemm / Conv whose activation input was quantized (QuantizeLinear -> DequantizeLinear on a
computed tensor) became an integer op. A float op still fed by an activation DequantizeLinear means
ORT runs that layer in float plus the QDQ ops: slower than the float model.

Models with dynamic per-token activations (scales computed per row in the graph) are reported, not
asserted: ORT's fusions take per-tensor activation scales only. For the same reason a MatMul fed by a
per-axis activation DequantizeLinear (per-head attention scales: a 1-D scale initializer) is
reported, not counted as unfused."""
import json
import os
import sys

import onnx

INTEGER_OPS = {"QLinearMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QLinearConv", "ConvInteger",
               "QGemm", "DynamicQuantizeMatMul", "QAttention"}
FLOAT_OPS = {"MatMul", "Gemm", "Conv", "FusedMatMul", "FusedConv", "FusedGemm"}
MOVES = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"}

manifest_path = sys.argv[1]
root = os.path.dirname(manifest_path)
with open(manifest_path) as f:
    manifest = json.load(f)
failed = 0
for m in manifest["models"]:
    if m["quantize_linear"] == 0:
        continue  # float model: nothing to fuse
    path = os.path.join(root, m["name"] + ".ort-extended.onnx")
    g = onnx.load(path).graph
    inits = {i.name for i in g.initializer}
    init_rank = {i.name: len(i.dims) for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    ops = {}
    for n in g.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    unfused, per_axis = [], []
    for n in g.node:
        if n.op_type not in FLOAT_OPS:
            continue
        for x in n.input[:2]:
            p = producer.get(x)
            while p is not None and p.op_type in MOVES:  # a DequantizeLinear behind data movement counts too
                p = producer.get(p.input[0])
            if p is not None and p.op_type == "DequantizeLinear" and p.input[0] not in inits:
                if init_rank.get(p.input[1], 0) > 0:
                    per_axis.append(f"{n.op_type} {n.name}")
                else:
                    unfused.append(f"{n.op_type} {n.name}")
                break
    integer = {k: v for k, v in sorted(ops.items()) if k in INTEGER_OPS}
    dynamic = m.get("activations") == "dynamic_per_token"
    ok = not unfused and (integer or dynamic)
    verdict = "ok  " if ok else ("note" if dynamic else "FAIL")
    print(f"{verdict} ORT fusion {m['name']:<10}: integer ops {integer or 'none'}; "
          f"{len(unfused)} float MatMul/Conv still on dequantized activations"
          + (f" ({', '.join(unfused[:4])}{' …' if len(unfused) > 4 else ''})" if unfused else "")
          + (" (dynamic per-token activations: not asserted)" if dynamic else "")
          + (f"; {len(per_axis)} on per-axis activation scales (per-head attention: ORT fuses per-tensor "
             "activation scales only; not asserted)" if per_axis else ""))
    if not ok and not dynamic:
        failed += 1
sys.exit(1 if failed else 0)
