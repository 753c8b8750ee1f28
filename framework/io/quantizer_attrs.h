// HDF5 attributes of one quantization point (observer kind and options, QSpec), shared by
// calibration dumps and model checkpoints so both spell them the same way (docs/formats.md).
#pragma once

#include <string>

#include "framework/core/qparams.h"
#include "framework/format/hdf5.h"
#include "observers/observer.h"

namespace qforge::io {

void write_quantizer_attrs(const h5::Group& g, const std::string& observer_kind, const ObserverOptions& options,
                           const QSpec& spec);
// Reads and validates them (the qtype must agree with the stored bits); throws qforge::Error.
void read_quantizer_attrs(const h5::Group& g, std::string* observer_kind, ObserverOptions* options, QSpec* spec);

using qforge::same_spec;  // framework/core/qparams.h
// The options observer `kind` reads are equal (the others do not matter).
bool same_options(const ObserverOptions& a, const ObserverOptions& b, const std::string& kind);

}  // namespace qforge::io
