# The headers `cmake --install` puts under include/qforge/, listed once here: the umbrella
# <qforge/qforge.h> (generated from QFORGE_UMBRELLA_HEADERS), the headers of the other exported
# libraries (qforge_io's model and calibration files, qforge_models, qforge_train, qforge_data),
# the components' headers, and every tree header these include. Internal and per-ISA headers stay
# in the build. The test public_headers_closed fails when a listed header includes one that is not
# listed: list the new header here, or keep it out of the public one.
set(QFORGE_UMBRELLA_HEADERS
  framework/core/error.h
  framework/core/qtype.h
  framework/io/model_io.h
  framework/nn/conv.h
  framework/nn/convert.h
  framework/nn/embedding.h
  framework/nn/layer_norm.h
  framework/nn/linear.h
  framework/nn/matmul.h
  framework/nn/rms_norm.h
  framework/nn/rpq.h
  framework/api/quantize.h
  framework/api/quantized_tensor.h
)
set(QFORGE_PUBLIC_HEADERS
  ${QFORGE_UMBRELLA_HEADERS}
  framework/core/isa.h
  framework/core/qparams.h
  framework/core/imatrix.h
  framework/data/char_tokenizer.h
  framework/data/fashion_mnist.h
  framework/data/language_id.h
  framework/data/text_corpus.h
  framework/io/calibration_dump.h
  framework/io/calibration_io.h
  framework/io/checkpoint.h
  framework/api/kernel_plan.h
  framework/api/kmeans.h
  framework/models/activation.h
  framework/models/bert.h
  framework/models/cnn.h
  framework/models/field_rule.h
  framework/models/gpt2.h
  framework/models/hf_folder.h
  framework/models/kv_cache.h
  framework/models/llama.h
  framework/models/generation.h
  framework/models/perplexity.h
  framework/models/sampling.h
  framework/models/gguf_export.h
  framework/models/gguf_load.h
  framework/models/gguf_imatrix.h
  framework/format/gguf.h
  framework/format/imatrix_file.h
  framework/models/mlp.h
  framework/models/state_dict.h
  framework/api/module_like.h
  framework/nn/batch_norm.h
  framework/nn/conv_bn_fold.h
  framework/nn/norm_layer.h
  framework/nn/packed_weight.h
  framework/nn/quantizable.h
  framework/nn/twin.h
  framework/api/progress.h
  framework/api/quantizer.h
  framework/api/scheme.h
  framework/train/batches.h
  framework/train/lr_schedule.h
  framework/train/trainer.h
  observers/observer.h
  # The components' headers (find_package(qforge COMPONENTS ptq search onnx dist recipe jit)).
  framework/ptq/adaround.h
  framework/ptq/awq.h
  framework/ptq/gptq.h
  framework/ptq/imatrix.h
  framework/ptq/numeric_suite.h
  framework/ptq/ptq.h
  framework/ptq/rotate.h
  framework/search/hessian.h
  framework/search/latency.h
  framework/search/search.h
  framework/onnx/export.h
  framework/dist/sync.h
  framework/dist/world.h
  framework/recipe/recipe.h
  framework/recipe/task.h
  # find_package(qforge COMPONENTS jit): the TorchScript front door.
  framework/jit/graph_rewrite.h
  framework/jit/scripted_layer.h
  framework/jit/scripted_model.h
)
