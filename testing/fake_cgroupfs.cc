#include "testing/fake_cgroupfs.h"

#include <unistd.h>

#include <algorithm>
#include <set>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {

namespace {

class FakeCgroupFs : public RealCgroupFs {
 public:
  Status mkdir(const std::string& dir) override {
    bool existed = path_exists(dir);
    TRY(mkdir_p(dir));
    if (existed) return {};
    auto parent_sub = read_file(dirname_of(dir) + "/cgroup.subtree_control");
    std::string ctrls;
    if (parent_sub.ok()) ctrls = trim(*parent_sub);
    TRY(write_file(dir + "/cgroup.controllers", ctrls + "\n"));
    for (const char* f : {"cgroup.procs", "cgroup.subtree_control", "cgroup.kill"})
      TRY(write_file(dir + "/" + f, ""));
    TRY(write_file(dir + "/cgroup.freeze", "0\n"));
    TRY(write_file(dir + "/cgroup.events", "populated 0\nfrozen 0\n"));
    return {};
  }
  Status rmdir(const std::string& dir) override {
    auto procs = read_file(dir + "/cgroup.procs");
    if (procs.ok() && !trim(*procs).empty()) return errno_error(EBUSY, "rmdir " + dir);
    return remove_tree(dir);
  }
  Status write(const std::string& file, const std::string& value) override {
    std::string name = file.substr(file.rfind('/') + 1);
    std::string dir = dirname_of(file);
    if (name == "cgroup.subtree_control") {
      // Apply "+a -b" edits the way the kernel does, refusing unknown controllers.
      auto avail = split(trim(read_file(dir + "/cgroup.controllers").value_or("")), ' ');
      std::set<std::string> have;
      for (auto& c : split(trim(read_file(file).value_or("")), ' '))
        if (!c.empty()) have.insert(c);
      for (auto& tok : split(trim(value), ' ')) {
        if (tok.size() < 2) continue;
        std::string c = tok.substr(1);
        if (std::find(avail.begin(), avail.end(), c) == avail.end())
          return errno_error(ENOENT, "write " + file);
        if (tok[0] == '+')
          have.insert(c);
        else
          have.erase(c);
      }
      std::string out;
      for (auto& c : have) out += (out.empty() ? "" : " ") + c;
      return write_file(file, out + "\n");
    }
    if (name == "cgroup.procs") {
      std::string v = trim(value);
      if (v == "0") v = std::to_string(::getpid());
      return write_file(file, v + "\n");
    }
    if (name == "cgroup.freeze") {
      TRY(write_file(file, value));
      return write_file(dir + "/cgroup.events", std::string("populated 0\nfrozen ") +
                                                    (trim(value) == "1" ? "1" : "0") + "\n");
    }
    if (name == "cgroup.kill") {
      TRY(write_file(dir + "/cgroup.procs", ""));
      return write_file(file, value);
    }
    return write_file(file, value);
  }
};

}  // namespace

std::unique_ptr<CgroupFs> make_fake_cgroupfs() {
  return std::make_unique<FakeCgroupFs>();
}

}  // namespace weft::agent
