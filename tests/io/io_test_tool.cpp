// Helper for tests/io: writes the committed format fixtures, and runs an endless save loop that
// checkpoint_test kills with SIGKILL in the middle of a save.
//   io_test_tool make-fixtures DIR      -> DIR/checkpoint_v1.h5, DIR/calibration_v1.h5
//   io_test_tool dequantize CKPT OUT    -> OUT holds every parameter of CKPT as float32, quantized
//                                          ones dequantized by qforge (the h5py example's oracle)
//   io_test_tool make-sparse-dataset OUT -> OUT: /x declares 2^28 float32 but stores nothing
//   io_test_tool save-loop PATH ELEMS   -> saves step 1, 2, ... forever; prints "S<step>\n" before
//                                          and "E<step>\n" after each save (flushed)
//   io_test_tool make-null-dataset OUT  -> OUT: /x is float32 with a null dataspace (no elements)
//   io_test_tool write-past-limit KIND PATH BYTES AGAIN -> writes a checkpoint or calibration
//                                          dump (KIND) to PATH while writes past BYTES fail as on
//                                          a full disk and prints the error; then lifts the limit,
//                                          saves to AGAIN and reads it back. Exits 0 when the
//                                          first save threw and the second one reads back, 3 when
//                                          the first claimed success, 4 when AGAIN reads back wrong
//   io_test_tool unwrite-dataset FILE DATASET -> replaces DATASET by a twin never written
//   io_test_tool make-hostile-names OUT -> OUT: a calibration dump whose numeric-suite table has a
//                                          layer name and note holding terminal escape sequences
//                                          and a NaN count (what a crafted file may hold)
//   io_test_tool make-long-names OUT   -> OUT: a calibration dump whose numeric-suite table holds
//                                          BERT's layer names (over 40 characters, sharing their
//                                          first 36) beside a short one
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>

#include "fake_quant/microscaling.h"
#include "framework/io/calibration_dump.h"
#include "framework/io/checkpoint.h"
#include "framework/format/hdf5.h"
#include "framework/api/quantized_tensor.h"
#include "tests/io/io_fixtures.h"

using namespace qforge::io;

namespace {
// Saves that need more than `limit` bytes: tensors small enough to sit in HDF5's chunk cache
// until their dataset is closed, or a dump whose metadata alone outgrows the limit. After the
// failed save the limit is lifted and the same data is saved to `again` and read back, as
// io::write_with_fallback does in the same process right after the failed close.
int write_past_limit(const std::string& kind, const std::string& path, rlim_t limit, const std::string& again) {
  CheckpointData d;
  for (int i = 0; i < 8; ++i) d.parameters["layer" + std::to_string(i) + ".weight"] = at::arange(65536, at::kFloat) + i;
  CalibrationDump dump;
  const CalibrationDump one = testing::calibration_v1();
  for (int i = 0; i < 400; ++i) dump["m" + std::to_string(i)] = one.begin()->second;
  const auto save = [&](const std::string& to) {
    if (kind == "checkpoint") save_checkpoint(to, d);
    else save_calibration_dump(to, dump);
  };
  if (kind != "checkpoint" && kind != "calibration") return 2;
  // Writes past the limit fail with EFBIG instead of killing the process, as ENOSPC would. Only
  // the soft limit is lowered, so that it can be lifted again.
  ::signal(SIGXFSZ, SIG_IGN);
  rlimit rl{limit, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return 2;
  try {
    save(path);
    std::printf("<no error>\n");
    return 3;
  } catch (const std::exception& e) {
    std::printf("%s\n", e.what());
  }
  rl.rlim_cur = RLIM_INFINITY;
  if (::setrlimit(RLIMIT_FSIZE, &rl) != 0) return 2;
  save(again);
  bool same = true;
  if (kind == "checkpoint") {
    const CheckpointReader r(again);
    for (const auto& [key, t] : d.parameters) same = same && at::equal(r.read_tensor(key), t);
  } else {
    same = load_calibration_dump(again).size() == dump.size();
  }
  std::printf(same ? "saved again and read back: %s\n" : "saved again, read back different: %s\n", again.c_str());
  return same ? 0 : 4;
}

// Deletes DATASET and creates it again with the same type, shape and layout but space allocated
// only when written, and never writes it: what a save that lost its data on a full disk leaves.
bool unwrite_dataset(const std::string& file, const std::string& dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  const hid_t old = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  const hid_t type = H5Dget_type(old), space = H5Dget_space(old), dcpl = H5Dget_create_plist(old);
  bool ok = f >= 0 && old >= 0 && type >= 0 && space >= 0 && dcpl >= 0;
  ok = ok && H5Dclose(old) >= 0 && H5Ldelete(f, dataset.c_str(), H5P_DEFAULT) >= 0;
  ok = ok && H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE) >= 0;
  const hid_t d = ok ? H5Dcreate2(f, dataset.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT) : -1;
  ok = ok && d >= 0;
  H5Dclose(d), H5Pclose(dcpl), H5Sclose(space), H5Tclose(type);
  return H5Fclose(f) >= 0 && ok;
}
}  // namespace

// A file in the HDF5 1.10 formats qforge writes (h5::File::open refuses the earliest ones), for
// hostile contents that must reach qforge's own checks.
static hid_t create_v110(const char* path) {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
  const hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  return file;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "make-fixtures" && argc == 3) {
      const std::string dir = argv[2];
      save_checkpoint(dir + "/checkpoint_v1.h5", testing::checkpoint_v1());
      save_calibration_dump(dir + "/calibration_v1.h5", testing::calibration_v1());
      return 0;
    }
    if (mode == "make-codebook-checkpoint" && argc == 3) {
      // k-means weights of every granularity and width (docs/formats.md), for the h5py reader.
      at::manual_seed(0);
      CheckpointData d;
      const struct {
        const char* key;
        qforge::QType qt;
        qforge::Granularity g;
        int64_t axis, group;
        std::vector<int64_t> shape;
      } cases[] = {{"fc.weight", qforge::qkmeans4, qforge::Granularity::kPerChannel, 0, 0, {6, 10}},
                   {"conv.weight", qforge::qkmeans3, qforge::Granularity::kPerChannel, 1, 0, {4, 3, 3, 3}},
                   {"emb.weight", qforge::qkmeans2, qforge::Granularity::kPerGroup, 0, 8, {5, 16}},
                   {"head.weight", qforge::qkmeans4, qforge::Granularity::kPerTensor, 0, 0, {3, 7}}};
      for (const auto& c : cases) {
        qforge::QSpec spec;
        spec.qtype = c.qt;
        spec.granularity = c.g;
        spec.axis = c.axis;
        spec.group_size = c.group;
        const at::Tensor w = at::randn(c.shape);
        std::vector<int64_t> cb_shape = qforge::codebook_shape(spec, w.sizes());
        // Levels: sorted float16 values spread over the weight's range.
        const at::Tensor levels = std::get<0>(at::randn(cb_shape).sort(-1)).to(at::kHalf).to(at::kFloat);
        d.quantized[c.key] = qforge::quantize_tensor(w, qforge::make_codebook_qparams(spec, levels, w.sizes()));
      }
      save_checkpoint(argv[2], d);
      return 0;
    }
    if (mode == "make-fp4-checkpoint" && argc == 3) {
      // mxfp4 / nvfp4 weights with outlier channels, so block scales lie far apart.
      at::manual_seed(0);
      CheckpointData d;
      for (const qforge::QType* qt : {&qforge::qmxfp4, &qforge::qnvfp4}) {
        const at::Tensor w = at::randn({6, 64}) * at::exp(at::randn({1, 64}) * 4.0);
        qforge::QSpec spec = qforge::microscaling_spec(*qt);
        d.quantized[std::string(qt->name) + ".weight"] = qforge::quantize_tensor(w, qforge::microscaling_qparams(w, spec));
      }
      save_checkpoint(argv[2], d);
      return 0;
    }
    if (mode == "dequantize" && argc == 4) {
      const CheckpointReader r(argv[2]);
      h5::File out = h5::File::create(argv[3]);
      for (const EntryInfo& e : r.entries(ReadOptions::parameters_only())) {
        out.root().write_tensor(e.key, r.read_tensor(e.key, Section::kParameters, true).to(at::kFloat));
      }
      out.close();
      return 0;
    }
    if (mode == "make-link-cycle" && argc == 3) {
      // /a/b/loop is a hard link back to /a: a cycle a naive walk recurses into forever.
      h5::File f = h5::File::create(argv[2]);
      const h5::Group a = f.root().create_group("a");
      const h5::Group b = a.create_group("b");
      b.write_tensor("x", at::arange(4, at::kFloat));
      b.link_hard("loop", a);
      f.close();
      return 0;
    }
    if (mode == "make-sparse-dataset" && argc == 3) {
      // /x declares 2^28 float32 (1 GiB) in chunks that were never written: a file of a few KiB
      // whose reader would allocate the whole declared size and fill it with fill values.
      const hid_t file = create_v110(argv[2]);
      const hsize_t dims[1] = {hsize_t{1} << 28}, chunk[1] = {hsize_t{1} << 16};
      const hid_t space = H5Screate_simple(1, dims, nullptr);
      const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      H5Pset_chunk(dcpl, 1, chunk);
      const hid_t d = H5Dcreate2(file, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      const bool ok = file >= 0 && space >= 0 && dcpl >= 0 && d >= 0;
      H5Dclose(d), H5Pclose(dcpl), H5Sclose(space), H5Fclose(file);
      return ok ? 0 : 1;
    }
    if (mode == "make-null-dataset" && argc == 3) {
      // /x is a float32 dataset with a null dataspace: no shape and no elements.
      const hid_t file = create_v110(argv[2]);
      const hid_t space = H5Screate(H5S_NULL);
      const hid_t d = H5Dcreate2(file, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      const bool ok = file >= 0 && space >= 0 && d >= 0;
      H5Dclose(d), H5Sclose(space);
      return H5Fclose(file) >= 0 && ok ? 0 : 1;
    }
    if (mode == "write-past-limit" && argc == 6) {
      return write_past_limit(argv[2], argv[3], static_cast<rlim_t>(std::atoll(argv[4])), argv[5]);
    }
    if (mode == "make-hostile-names" && argc == 3) {
      LayerErrorTable t;
      t.batches = 1;
      t.layers.push_back({"evil\x1b]0;pwned\x07name", "Linear", "note\x1b[2J",
                          {{"own_sqnr_db", 12.5}, {"nonfinite_inputs", std::nan("")}}});
      t.layers.push_back({"fc2", "Linear", "", {{"own_sqnr_db", 20.0}}});  // no count at all
      save_calibration_dump(argv[2], CalibrationDump{}, nullptr, &t);
      return 0;
    }
    if (mode == "make-long-names" && argc == 3) {
      LayerErrorTable t;
      t.batches = 2;
      for (const char* leaf : {"query", "key", "value"})
        t.layers.push_back({std::string("bert.encoder.layer.1.attention.self.") + leaf, "Linear", "",
                            {{"weight_sqnr_db", 30.5}, {"own_sqnr_db", 25.25}, {"nonfinite_inputs", 0.0}}});
      t.layers.push_back({"fc", "Linear", "", {{"weight_sqnr_db", 40.0}, {"own_sqnr_db", 35.0}}});
      save_calibration_dump(argv[2], CalibrationDump{}, nullptr, &t);
      return 0;
    }
    if (mode == "unwrite-dataset" && argc == 4) return unwrite_dataset(argv[2], argv[3]) ? 0 : 1;
    if (mode == "save-loop" && argc == 4) {
      at::set_num_threads(1);
      const std::string path = argv[2];
      const int64_t elems = std::atoll(argv[3]);
      for (int64_t step = 1;; ++step) {
        // Every tensor holds `step`, so a reader can tell a consistent file from a torn one.
        CheckpointData d;
        d.step = step;
        d.parameters["big.weight"] = at::full({elems}, static_cast<float>(step));
        d.parameters["small.bias"] = at::full({7}, static_cast<float>(step));
        d.buffers["counter"] = at::scalar_tensor(step, at::kLong);
        std::printf("S%lld\n", static_cast<long long>(step));
        std::fflush(stdout);
        save_checkpoint(path, d);
        std::printf("E%lld\n", static_cast<long long>(step));
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "io_test_tool: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: io_test_tool make-fixtures DIR | dequantize CKPT OUT | make-link-cycle OUT | make-sparse-dataset OUT | make-null-dataset OUT | make-hostile-names OUT | make-long-names OUT | save-loop PATH ELEMS | write-past-limit checkpoint|calibration PATH BYTES AGAIN | unwrite-dataset FILE DATASET\n");
  return 2;
}
