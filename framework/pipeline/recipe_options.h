// The options of qforge's training, search and solver APIs as a recipe sets them.
#pragma once

#include <atomic>
#include <string>

#include "framework/ptq/awq.h"
#include "framework/ptq/ptq.h"
#include "framework/recipe/recipe.h"
#include "framework/search/search.h"
#include "framework/train/batches.h"
#include "framework/train/trainer.h"

namespace qforge::pipeline {

// Training `epochs` over `data` at `lr` (float training or QAT), warm-up as a fraction of the run.
train::TrainOptions train_options(const Recipe& r, const train::BatchSource& data, int64_t epochs, double lr,
                                  int64_t max_steps, const std::string& label, const std::atomic<bool>* cancel);

search::SearchOptions search_options(const Recipe& r);

ptq::SolveOptions solve_options(const Recipe& r);
ptq::AwqOptions awq_options(const Recipe& r);

// The recipe asks the solve stage for something besides round-to-nearest.
bool solves(const Recipe& r);

}  // namespace qforge::pipeline
