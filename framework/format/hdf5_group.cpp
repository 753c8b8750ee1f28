// HDF5 wrappers: groups (children, links, walks).
#include "framework/format/hdf5.h"
#include "framework/format/hdf5_internal.h"

#include <algorithm>
#include <functional>
#include <set>

#include "framework/core/error.h"

namespace qforge::io::h5 {

using namespace internal;

ObjectType Group::child_type(const std::string& name) const {
  Lock lock;
  require_name(name, where());
  const htri_t exists = H5Lexists(id_.get(), name.c_str(), H5P_DEFAULT);
  check(exists, where(), "cannot look up '" + name + "'");
  if (exists == 0) return ObjectType::kNone;
  H5O_info_t oinfo;
  check(H5Oget_info_by_name2(id_.get(), name.c_str(), &oinfo, H5O_INFO_BASIC, H5P_DEFAULT), where(),
        "cannot read object info of '" + name + "'");
  if (oinfo.type == H5O_TYPE_GROUP) return ObjectType::kGroup;
  if (oinfo.type == H5O_TYPE_DATASET) return ObjectType::kDataset;
  return ObjectType::kOther;
}

namespace {
herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> Group::children() const {
  Lock lock;
  std::vector<std::string> names;
  hsize_t idx = 0;
  check(H5Literate(id_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_link, &names), where(),
        "cannot list children");
  std::sort(names.begin(), names.end());
  return names;
}

Group Group::create_group(const std::string& name) const {
  Lock lock;
  require_name(name, where());
  Id gcpl(H5Pcreate(H5P_GROUP_CREATE));
  // No timestamps: the same content gives the same bytes (fixtures, diffs).
  H5Pset_obj_track_times(gcpl.get(), false);
  set_compact_storage(gcpl.get(), where());
  Id g(H5Gcreate2(id_.get(), name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
  if (!g.valid()) fail(where(), "cannot create group '" + name + "'");
  return Group(std::move(g), child_path(name), file_path_);
}

void Group::link_hard(const std::string& name, const Object& target) const {
  Lock lock;
  require_name(name, where());
  check(H5Lcreate_hard(target.id_.get(), ".", id_.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT), where(),
        "cannot link '" + name + "' to " + target.path());
}

Group Group::open_group(const std::string& name) const {
  Lock lock;
  const ObjectType t = child_type(name);
  if (t == ObjectType::kNone) fail(where(), "missing group '" + child_path(name) + "'");
  if (t != ObjectType::kGroup) fail(where(), "'" + child_path(name) + "' is not a group");
  Id g(H5Gopen2(id_.get(), name.c_str(), H5P_DEFAULT));
  if (!g.valid()) fail(where(), "cannot open group '" + child_path(name) + "'");
  return Group(std::move(g), child_path(name), file_path_);
}

Dataset Group::open_dataset(const std::string& name) const {
  Lock lock;
  const ObjectType t = child_type(name);
  if (t == ObjectType::kNone) fail(where(), "missing dataset '" + child_path(name) + "'");
  if (t != ObjectType::kDataset) fail(where(), "'" + child_path(name) + "' is not a dataset");
  Id d(H5Dopen2(id_.get(), name.c_str(), H5P_DEFAULT));
  if (!d.valid()) fail(where(), "cannot open dataset '" + child_path(name) + "'");
  return Dataset(std::move(d), child_path(name), file_path_);
}

void Group::visit(const std::function<void(const std::string&, ObjectType, int)>& fn) const {
  std::set<uint64_t> seen{address()};
  std::function<void(const Group&, const std::string&, int)> walk = [&](const Group& g,
                                                                        const std::string& prefix,
                                                                        int depth) {
    for (const std::string& name : g.children()) {
      const std::string rel = prefix.empty() ? name : prefix + "/" + name;
      const ObjectType t = g.child_type(name);
      fn(rel, t, depth);
      if (t != ObjectType::kGroup) continue;
      const Group child = g.open_group(name);
      if (seen.insert(child.address()).second) walk(child, rel, depth + 1);
    }
  };
  walk(*this, "", 0);
}

}  // namespace qforge::io::h5
