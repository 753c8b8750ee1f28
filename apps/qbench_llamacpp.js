// qbench's llama.cpp peer (apps/qbench_llamacpp.cpp): loads a GGUF file in node-llama-cpp's
// prebuilt CPU llama.cpp with `threads` threads, evaluates the prompt once, prints "ready", then
// for every "run" line decodes `decode` tokens greedily one at a time after the prompt (token ids,
// no tokenizer), erases them from the cache again and prints "done <last token>".
// Usage: node qbench_llamacpp.js NODE_MODULES_DIR MODEL THREADS PROMPT_IDS(comma-separated) DECODE
const path = require('path');
const readline = require('readline');
const {pathToFileURL} = require('url');

async function main() {
  const [modules, modelPath, threadsArg, promptArg, decodeArg] = process.argv.slice(2);
  const entry = pathToFileURL(path.join(modules, 'node-llama-cpp', 'dist', 'index.js')).href;
  const {getLlama, LlamaLogLevel} = await import(entry);
  const threads = Number(threadsArg), decode = Number(decodeArg);
  const prompt = promptArg.split(',').map(Number);
  const llama = await getLlama({gpu: false, build: 'never', logLevel: LlamaLogLevel.error});
  const model = await llama.loadModel({modelPath, gpuLayers: 0});
  const context = await model.createContext({contextSize: 256, threads, batchSize: 256});
  const sequence = context.getSequence();
  const greedy = {generateNext: {token: true, options: {temperature: 0}}};
  const first = (await sequence.controlledEvaluate(prompt.map((t, i) => (i === prompt.length - 1 ? [t, greedy] : t))))
      [prompt.length - 1].next.token;
  console.log('ready');
  const lines = readline.createInterface({input: process.stdin});
  for await (const line of lines) {
    if (line !== 'run') break;
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
