// HDF5 wrappers: tensor datasets, written by Group::write_tensor and read with size and storage
// checks.
#include "framework/format/hdf5.h"
#include "framework/format/hdf5_internal.h"

#include <ATen/ATen.h>

#include "framework/core/error.h"

namespace qforge::io::h5 {

using namespace internal;

namespace {
at::ScalarType logical_dtype(const std::string& torch_dtype, const std::string& where) {
  if (torch_dtype == "bool") return at::kBool;
  if (torch_dtype == "bfloat16") return at::kBFloat16;
  fail(where, "unknown torch_dtype '" + torch_dtype + "'");
}
}  // namespace

DatasetInfo Dataset::info() const {
  Lock lock;
  DatasetInfo inf = stored_info();
  if (has_attr(kTorchDtypeAttr)) inf.dtype = logical_dtype(attr_string(kTorchDtypeAttr), where());
  return inf;
}

DatasetInfo Dataset::stored_info() const {
  Lock lock;
  DatasetInfo info;
  Id space(H5Dget_space(id_.get()));
  if (!space.valid()) fail(where(), "cannot read the dataspace");
  info.shape = dataspace_dims(space.get(), where());
  Id type(H5Dget_type(id_.get()));
  if (!type.valid()) fail(where(), "cannot read the element type");
  info.dtype = dtype_of(type.get(), where());
  return info;
}

namespace {
// Declared sizes are checked against what the file stores before anything is allocated: an
// element count that overflows, or a shape far larger than the dataset's storage (a few bytes on
// disk declaring gigabytes, read back as fill values), is refused. Compression filters may
// legitimately expand data (deflate at most ~1032:1); small datasets are always read.
constexpr uint64_t kAlwaysReadableBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxCompressionRatio = 1100;

void check_declared_size(hid_t dataset, const DatasetInfo& inf, const std::string& where) {
  uint64_t count = 1;
  for (int64_t d : inf.shape) {
    if (d < 0 || (d > 0 && count > (uint64_t{1} << 48) / static_cast<uint64_t>(d)))
      fail(where, "declares shape " + shape_string(inf.shape) + ": more than 2^48 elements");
    count *= static_cast<uint64_t>(d);
  }
  const uint64_t bytes = count * static_cast<uint64_t>(c10::elementSize(inf.dtype));
  if (bytes <= kAlwaysReadableBytes) return;
  const uint64_t stored = H5Dget_storage_size(dataset);
  Id dcpl(H5Dget_create_plist(dataset));
  bool compressed = false;
  const int nfilters = dcpl.valid() ? H5Pget_nfilters(dcpl.get()) : 0;
  for (int i = 0; i < nfilters; ++i) {
    unsigned flags = 0;
    size_t nelmts = 0;
    unsigned int cd_values[1];
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelmts, cd_values, 0,
                                          nullptr, nullptr);
    if (f != H5Z_FILTER_FLETCHER32) compressed = true;
  }
  const uint64_t limit = compressed ? stored * kMaxCompressionRatio : stored;
  if (bytes > limit)
    fail(where, detail::str_cat("declares shape ", shape_string(inf.shape), " (", bytes, " bytes) but the file stores ",
                                stored, " bytes for it", compressed ? " (compressed)" : "",
                                ": truncated or corrupted file"));
}

// A dataset with elements but without all of its storage was never completely written (a save
// that failed on a full disk): HDF5 would read it back as fill values, zeros that look like data.
void check_storage_written(hid_t dataset, const DatasetInfo& inf, const std::string& where) {
  // A null dataspace has no shape and no elements (its rank 0 would otherwise read as a scalar).
  Id file_space(H5Dget_space(dataset));
  if (!file_space.valid()) fail(where, "cannot read the dataspace");
  if (H5Sget_simple_extent_type(file_space.get()) == H5S_NULL)
    fail(where, "has no stored data (never written, or created without data)");
  uint64_t count = 1;
  for (int64_t d : inf.shape) count *= static_cast<uint64_t>(d);
  if (count == 0) return;
  Id dcpl(H5Dget_create_plist(dataset));
  if (!dcpl.valid()) fail(where, "cannot read the creation properties");
  const char* unwritten = ": never completely written (a save that failed, e.g. on a full disk)";
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(inf.shape.size());
    check(H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), where, "cannot read the chunk shape");
    uint64_t expected = 1;
    for (size_t i = 0; i < chunk.size(); ++i)
      expected *= (static_cast<uint64_t>(inf.shape[i]) + chunk[i] - 1) / chunk[i];
    hsize_t stored = 0;
    // HDF5 >= 1.10.5; 1.10 does not take H5S_ALL for the space.
    check(H5Dget_num_chunks(dataset, file_space.get(), &stored), where, "cannot count the stored chunks");
    if (stored < expected) fail(where, detail::str_cat("stores ", stored, " of its ", expected, " chunks", unwritten));
  } else if (layout == H5D_CONTIGUOUS) {
    Id type(H5Dget_type(dataset));
    if (!type.valid()) fail(where, "cannot read the element type");
    const uint64_t bytes = count * H5Tget_size(type.get());
    const uint64_t stored = H5Dget_storage_size(dataset);
    if (stored < bytes) fail(where, detail::str_cat("stores ", stored, " of its ", bytes, " bytes", unwritten));
  }
}
}  // namespace

at::Tensor Dataset::read() const {
  Lock lock;
  const DatasetInfo inf = stored_info();
  check_declared_size(id_.get(), inf, where());
  check_storage_written(id_.get(), inf, where());
  at::Tensor t = at::empty(inf.shape, at::TensorOptions().dtype(inf.dtype));
  if (t.numel() > 0) {
    Id mem = memory_type(inf.dtype);
    check(H5Dread(id_.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), where(),
          "cannot read data (truncated or corrupted file?)");
  }
  if (has_attr(kTorchDtypeAttr)) {
    const at::ScalarType d = logical_dtype(attr_string(kTorchDtypeAttr), where());
    return d == at::kBool ? t.ne(0) : t.to(d);
  }
  return t;
}

Dataset Group::write_tensor(const std::string& name, const at::Tensor& tensor) const {
  QF_REQUIRE(tensor.defined(), "framework/io: ", where(), ": undefined tensor for dataset '",
             child_path(name), "'");
  at::Tensor t = tensor.detach().cpu();
  std::string torch_dtype;
  if (t.scalar_type() == at::kBool) {
    torch_dtype = "bool";
    t = t.to(at::kByte);
  } else if (t.scalar_type() == at::kBFloat16) {
    torch_dtype = "bfloat16";
    t = t.to(at::kFloat);  // exact: every bfloat16 is a float32
  }
  t = t.contiguous();
  Lock lock;
  require_name(name, where());
  const std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  Id ftype = file_type(t.scalar_type());
  Id mtype = memory_type(t.scalar_type());
  Id space = simple_space(shape);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_obj_track_times(dcpl.get(), false);
  check(H5Pset_attr_phase_change(dcpl.get(), kMaxCompact, kMaxCompact - 1), where(),
        "cannot keep attributes compact");
  if (!shape.empty() && t.numel() > 0) {
    // Chunks of whole trailing rows, halving the leading dimensions until a chunk is small.
    std::vector<hsize_t> chunk(shape.begin(), shape.end());
    auto chunk_bytes = [&] {
      int64_t b = t.element_size();
      for (hsize_t c : chunk) b *= static_cast<int64_t>(c);
      return b;
    };
    for (size_t d = 0; d < chunk.size() && chunk_bytes() > kMaxChunkBytes; ++d) {
      while (chunk[d] > 1 && chunk_bytes() > kMaxChunkBytes) chunk[d] = (chunk[d] + 1) / 2;
    }
    check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), where(),
          "cannot set chunking for '" + name + "'");
    check(H5Pset_fletcher32(dcpl.get()), where(), "cannot enable Fletcher-32 for '" + name + "'");
  }
  Id d(H5Dcreate2(id_.get(), name.c_str(), ftype.get(), space.get(), H5P_DEFAULT, dcpl.get(),
                  H5P_DEFAULT));
  if (!d.valid()) fail(where(), "cannot create dataset '" + child_path(name) + "'");
  if (t.numel() > 0) {
    check(H5Dwrite(d.get(), mtype.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()), where(),
          "cannot write dataset '" + child_path(name) + "'");
  }
  Dataset ds(std::move(d), child_path(name), file_path_);
  if (!torch_dtype.empty()) ds.set_attr(kTorchDtypeAttr, torch_dtype);
  return ds;
}

}  // namespace qforge::io::h5
