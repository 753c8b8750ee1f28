// Accuracy of an exported Fashion-MNIST model (qtrain --recipe recipes/fmnist_cnn_int8.yaml
// --set export.onnx=true) under ONNX Runtime on the 10 000 test images, for comparison with the
// frozen model's accuracy in report.json (docs/onnx.md, "A trained model"). Images are scaled to
// [0, 1] as framework/data/fashion_mnist.cpp does.
//   NODE_PATH=build/tests/onnx/consumers/onnxruntime-node/node_modules \
//     node tests/onnx/eval_fmnist_ort.js runs/fmnist_cnn_int8/model.onnx
const fs = require('fs');
const zlib = require('zlib');
const ort = require('onnxruntime-node');

const dir = process.env.QFORGE_FASHION_MNIST_DIR || '/usr/share/datasets/fashion-mnist';

function idx(file) {
  const b = zlib.gunzipSync(fs.readFileSync(`${dir}/${file}`));
  const dims = b[3];
  const shape = [];
  for (let i = 0; i < dims; i++) shape.push(b.readUInt32BE(4 + 4 * i));
  return {shape, data: b.subarray(4 + 4 * dims)};
}

async function main() {
  const images = idx('t10k-images-idx3-ubyte.gz'), labels = idx('t10k-labels-idx1-ubyte.gz');
  const [n, h, w] = images.shape;
  const session = await ort.InferenceSession.create(process.argv[2]);
  const input = session.inputNames[0], output = session.outputNames[0];
  const batch = 500;
  let correct = 0;
  for (let s = 0; s < n; s += batch) {
    const m = Math.min(batch, n - s);
    const x = new Float32Array(m * h * w);
    for (let i = 0; i < m * h * w; i++) x[i] = images.data[s * h * w + i] / 255;
    const y = (await session.run({[input]: new ort.Tensor('float32', x, [m, 1, h, w])}))[output];
    const classes = y.dims[1];
    for (let r = 0; r < m; r++) {
      let best = 0;
      for (let c = 1; c < classes; c++) if (y.data[r * classes + c] > y.data[r * classes + best]) best = c;
      correct += best === labels.data[s + r];
    }
  }
  console.log(`onnxruntime ${ort.env.versions.common}: ${process.argv[2]}: test accuracy ${(correct / n).toFixed(4)} ` +
              `(${correct}/${n})`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
