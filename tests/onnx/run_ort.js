// ONNX Runtime (onnxruntime-node) as a consumer of qforge's ONNX export: runs each model of a
// manifest (onnx_fixture_tool) on its inputs and compares with qforge's frozen output, twice
// (docs/onnx.md, "Agreement"):
//   graph: every ORT optimisation on, but the DequantizeLinear -> MatMul fusion (MatMulNBits)
//          computing in float32 (session.qdq_matmulnbits_accuracy_level = 1), so ORT computes
//          what the graph says: max |ort - qforge| <= 1e-2 * max |qforge| + 1e-5 and the arg-max
//          of every output row equal;
//   default: ORT's defaults, whose MatMulNBits quantizes activations to int8 blocks of its own
//          (accuracy level 4): max |ort - qforge| <= 5e-2 * max |qforge| + 1e-5, arg-max reported;
//   extended: ORT's fusions (QDQ -> QLinearMatMul / MatMulIntegerToFloat / QLinearConv) without
//          its layout transforms, same tolerance; the optimised graph is saved as
//          NAME.ort-extended.onnx for check_ort_fusion.py.
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

function readTensor(dir, t) {
  const buf = fs.readFileSync(path.join(dir, t.file));
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  const data = t.type === 'int64' ? new BigInt64Array(ab) : new Float32Array(ab);
  return new ort.Tensor(t.type, data, t.shape);
}

async function main() {
  const manifestPath = process.argv[2];
  const dir = path.dirname(manifestPath);
  const manifest = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
  let failed = 0;
  const modes = [
    {name: 'graph', options: {extra: {session: {qdq_matmulnbits_accuracy_level: '1'}}}, rel: 1e-2, argmax: true},
    {name: 'default', options: {}, rel: 5e-2, argmax: false},
    // ORT's graph fusions without its hardware-specific layouts, the optimised graph saved for
    // check_ort_fusion.py (which quantized MatMul / Conv became integer ops).
    {name: 'extended', options: {graphOptimizationLevel: 'extended'}, save: true, rel: 5e-2, argmax: false},
  ];
  for (const m of manifest.models) {
    const feeds = {};
    for (const t of m.inputs) feeds[t.name] = readTensor(dir, t);
    const want = readTensor(dir, m.expected);
    for (const mode of modes) {
      const options = {...mode.options};
      if (mode.save) options.optimizedModelFilePath = path.join(dir, `${m.name}.ort-${mode.name}.onnx`);
      const session = await ort.InferenceSession.create(path.join(dir, m.file), options);
      const got = (await session.run(feeds))[m.expected.name];
      if (JSON.stringify(Array.from(got.dims)) !== JSON.stringify(m.expected.shape)) {
        console.log(`FAIL ${m.name} (${mode.name}): shape ${got.dims} vs ${m.expected.shape}`);
        failed++;
        continue;
      }
      let maxDiff = 0, maxRef = 0;
      for (let i = 0; i < want.data.length; i++) {
        maxDiff = Math.max(maxDiff, Math.abs(got.data[i] - want.data[i]));
        maxRef = Math.max(maxRef, Math.abs(want.data[i]));
      }
      const last = m.expected.shape[m.expected.shape.length - 1];
      let rows = 0, sameArgmax = 0;
      for (let r = 0; r < want.data.length / last; r++, rows++) {
        let a = 0, b = 0;
        for (let j = 1; j < last; j++) {
          if (got.data[r * last + j] > got.data[r * last + a]) a = j;
          if (want.data[r * last + j] > want.data[r * last + b]) b = j;
        }
        sameArgmax += a === b;
      }
      const tol = mode.rel * maxRef + 1e-5;
      const ok = maxDiff <= tol && (!mode.argmax || sameArgmax === rows);
      console.log(`${ok ? 'ok  ' : 'FAIL'} onnxruntime ${ort.env.versions.common} ${m.name.padEnd(10)} ${mode.name.padEnd(7)}: ` +
                  `max |ort - qforge| = ${maxDiff.toExponential(2)} (tolerance ${tol.toExponential(2)}, max |qforge| ` +
                  `${maxRef.toFixed(3)}; qforge frozen vs fake-quant ${m.frozen_vs_fake_quant.toExponential(2)}), ` +
                  `arg-max equal in ${sameArgmax}/${rows} rows`);
      if (!ok) failed++;
    }
  }
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`FAIL: ${e.stack || e}`);
  process.exit(1);
});
