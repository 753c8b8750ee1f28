// qbench's llama.cpp peer (apps/qbench_llamacpp.cpp): loads a GGUF file in node-llama-cpp's
// prebuilt CPU llama.cpp with `threads` threads, evaluates the prompt once, prints "ready", then
// for every "run" line decodes `decode` tokens greedily one at a time after the prompt (token ids,
// no tokenizer), erases them from the cache again and prints "done <last token>". With decode 0
// (the prefill rows) each "run" instead empties the cache and evaluates the whole prompt again in
// batches of up to 512 tokens, printing "done <next token>". KV_CACHE (default f16, llama.cpp's
// own default) sets the cache's type for keys and values, as -ctk / -ctv do: q8_0 or q4_0 turn on
// flash attention, which llama.cpp needs for a quantized V cache (node-llama-cpp's
// experimentalKvCacheKeyType / experimentalKvCacheValueType, GgmlType names).
// Usage: node qbench_llamacpp.js NODE_MODULES_DIR MODEL THREADS PROMPT_IDS(comma-separated) DECODE [KV_CACHE]
const path = require('path');
const readline = require('readline');
const {pathToFileURL} = require('url');

async function main() {
  const [modules, modelPath, threadsArg, promptArg, decodeArg, kvArg = 'f16'] = process.argv.slice(2);
  const entry = pathToFileURL(path.join(modules, 'node-llama-cpp', 'dist', 'index.js')).href;
  const {getLlama, LlamaLogLevel} = await import(entry);
  const threads = Number(threadsArg), decode = Number(decodeArg);
  const prompt = promptArg.split(',').map(Number);
  const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error});
  const model = await llama.loadModel({modelPath, gpuLayers: 0});
  const size = Math.max(256, 2 ** Math.ceil(Math.log2(prompt.length + decode + 1)));
  const options = {contextSize: size, threads, batchSize: Math.min(size, 512)};
  if (kvArg !== 'f16') {
    const type = kvArg.toUpperCase();  // GgmlType's names: Q8_0, Q4_0
    Object.assign(options, {flashAttention: true, experimentalKvCacheKeyType: type, experimentalKvCacheValueType: type});
  }
  const context = await model.createContext(options);
  const sequence = context.getSequence();
  const greedy = {generateNext: {token: true, options: {temperature: 0}}};
  const first = (await sequence.controlledEvaluate(prompt.map((t, i) => (i === prompt.length - 1 ? [t, greedy] : t))))
      [prompt.length - 1].next.token;
  console.log('ready');
  const lines = readline.createInterface({input: process.stdin});
  for await (const line of lines) {
    if (line !== 'run') break;
    if (decode === 0) {
      await sequence.eraseContextTokenRanges([{start: 0, end: sequence.nextTokenIndex}]);
      const out = await sequence.controlledEvaluate(prompt.map((t, i) => (i === prompt.length - 1 ? [t, greedy] : t)));
      console.log(`done ${out[prompt.length - 1].next.token}`);
      continue;
    }
    let next = first;
    for (let t = 0; t < decode; ++t) next = (await sequence.controlledEvaluate([[next, greedy]]))[0].next.token;
    await sequence.eraseContextTokenRanges([{start: prompt.length, end: sequence.nextTokenIndex}]);
    console.log(`done ${next}`);
  }
  await context.dispose();
  await model.dispose();
  await llama.dispose();
}

main().catch((e) => { console.log(`error ${String(e.stack || e).replace(/\n/g, ' | ')}`); process.exit(1); });
