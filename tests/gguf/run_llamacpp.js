// llama.cpp (node-llama-cpp's prebuilt CPU library) runs each GGUF file gguf_llamacpp_tool wrote:
// token ids go in directly (no tokenizer), one thread, greedy decoding of as many tokens as qforge
// produced, the full next-token distribution read at every step. Checks (docs/formats.md, "GGUF"):
//   - llama.cpp's greedy tokens equal qforge's. Where qforge's own top two probabilities are within
//     the case's tolerance of each other the choice is a tie at that precision: a different token
//     there ends the comparison (reported), any other difference fails;
//   - max over the vocabulary of |p_llama.cpp - p_qforge| <= tolerance at every compared step.
// Usage: node run_llamacpp.js MANIFEST
const fs = require('fs');
const path = require('path');

// |Δp| allowed: F32 files compute what qforge computes up to float rounding and ggml's GELU, which
// reads a float16 table (measured: Llama 1.5e-6, GPT-2 4.5e-4); quantized files run llama.cpp's
// Q8_0 / Q4_0 dot products, which also quantize the activations to 8-bit blocks (measured <= 4.4e-2).
const TOLERANCE = {f32: 1e-3, q8_0: 8e-2, w8: 8e-2, w4g32: 8e-2, q6_k: 8e-2, q4_k: 8e-2};

function tolerance(name) {
  for (const [k, v] of Object.entries(TOLERANCE)) if (name.endsWith(k)) return v;
  throw new Error(`no tolerance for ${name}`);
}

async function main() {
  const manifestPath = process.argv[2];
  const dir = path.dirname(manifestPath);
  const {cases} = JSON.parse(fs.readFileSync(manifestPath, 'utf8'));
  const {getLlama, LlamaLogLevel} = await import('node-llama-cpp');
  const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error});
  let failed = 0;
  for (const c of cases) {
    const tol = tolerance(c.name);
    const model = await llama.loadModel({modelPath: path.join(dir, c.file), gpuLayers: 0});
    // F32 keys and values (llama.cpp caches F16 by default), so F32 files compute in float32 throughout.
    const context = await model.createContext({contextSize: 64, threads: 1, batchSize: 64, flashAttention: false,
      experimentalKvCacheKeyType: 'F32', experimentalKvCacheValueType: 'F32'});
    const sequence = context.getSequence();
    const step = {generateNext: {token: true, probabilities: true, options: {temperature: 0}}};
    let input = c.prompt.map((t, i) => (i === c.prompt.length - 1 ? [t, step] : t));
    const got = [];
    let maxDiff = 0, verdict = 'equal', minMargin = Infinity;
    for (let s = 0; s < c.greedy.length; ++s) {
      const out = await sequence.controlledEvaluate(input);
      const next = out[input.length - 1].next;
      const want = c.probs[s];
      let diff = 0;
      for (let t = 0; t < want.length; ++t) diff = Math.max(diff, Math.abs((next.probabilities.get(t) ?? 0) - want[t]));
      maxDiff = Math.max(maxDiff, diff);
      const sorted = [...want].sort((a, b) => b - a);
      const margin = sorted[0] - sorted[1];
      minMargin = Math.min(minMargin, margin);
      got.push(next.token);
      if (next.token !== c.greedy[s]) {
        verdict = margin <= tol ? `tie at step ${s} (qforge's top-2 margin ${margin.toExponential(2)})` : 'DIFFERENT';
        break;
      }
      input = [[next.token, step]];
    }
    const ok = verdict !== 'DIFFERENT' && maxDiff <= tol;
    if (!ok) failed++;
    console.log(`${ok ? 'ok  ' : 'FAIL'} ${c.name} (${c.compares}): greedy ${verdict}, ` +
                `qforge [${c.greedy.join(' ')}] llama.cpp [${got.join(' ')}], max |dp| ${maxDiff.toExponential(2)} ` +
                `(tolerance ${tol}), smallest qforge top-2 margin ${minMargin.toExponential(2)}`);
    await context.dispose();
    await model.dispose();
  }
  await llama.dispose();
  process.exit(failed ? 1 : 0);
}

main().catch((e) => { console.log(`FAIL: ${e.stack || e}`); process.exit(1); });
