// qbench's ONNX Runtime peer (apps/qbench_models.cpp, impls "onnxruntime" / "onnxruntime-fp32"):
// loads an ONNX file in onnxruntime-node (graph optimisations at ORT's default level "all",
// `threads` intra-op threads, 1 inter-op thread, sequential execution), reads the inputs a JSON
// list names ({name, file, type: "float32" | "int64", shape}), runs once as warm-up, prints
// "ready", then runs the session once per "run" line and prints "done".
// Usage: node qbench_ort.js NODE_MODULES_DIR MODEL THREADS INPUTS_JSON
const fs = require('fs');
const path = require('path');
const readline = require('readline');

async function main() {
  const [modules, modelPath, threadsArg, inputsPath] = process.argv.slice(2);
  const ort = require(path.join(modules, 'onnxruntime-node'));
  const session = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: Number(threadsArg), interOpNumThreads: 1, executionMode: 'sequential'});
  const feeds = {};
  for (const t of JSON.parse(fs.readFileSync(inputsPath, 'utf8'))) {
    const buf = fs.readFileSync(t.file);
    const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
    feeds[t.name] = new ort.Tensor(t.type, t.type === 'int64' ? new BigInt64Array(ab) : new Float32Array(ab), t.shape);
  }
  await session.run(feeds);
  console.log('ready');
  const lines = readline.createInterface({input: process.stdin});
  for await (const line of lines) {
    if (line !== 'run') break;
    await session.run(feeds);
    console.log('done');
  }
  await session.release();
}

main().catch((e) => { console.log(`error ${String(e.stack || e).replace(/\n/g, ' | ')}`); process.exit(1); });
