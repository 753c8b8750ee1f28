// The stages of qtrain in the order they run: the one list the dry run, --stages validation and
// the run iterate. A new stage is a file defining a Stage and one line in stage_registry.cpp.
#pragma once

#include <string>
#include <vector>

#include "framework/pipeline/stage.h"

namespace qforge::pipeline {

const std::vector<const Stage*>& stages();

// The stage called `name`, or null.
const Stage* find_stage(const std::string& name);

// One factory per stage file, in pipeline order.
const Stage& data_stage();
const Stage& float_stage();
const Stage& search_stage();
const Stage& calibrate_stage();
const Stage& solve_stage();
const Stage& ptq_stage();
const Stage& qat_stage();
const Stage& layer_errors_stage();
const Stage& freeze_stage();
const Stage& export_stage();

}  // namespace qforge::pipeline
