// Every example a user can copy is checked by the parser of what it shows: the TOML
// blocks of docs/*.md and README.md, examples/, the shipped configuration files and
// profiles. A doc that shows a job, profile or configuration that weft would refuse
// fails here. (docs/jobs.md's job is also run for real: MultiMachine.TheJobsGuideExampleRuns.)
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "agent/agent_conf.h"
#include "cli/cli_config.h"
#include "common/fs.h"
#include "common/job_file.h"
#include "controlplane/daemon/cp_conf.h"
#include "hcs/hcs_conf.h"
#include "sidekick/profile.h"
#include "sidekick/sidekick_conf.h"

namespace weft {
namespace {

namespace fs = std::filesystem;

struct Block {
  std::string where;  // file:line of the opening fence
  std::string text;
};

// The ```toml blocks of a Markdown file.
std::vector<Block> toml_blocks(const std::string& path) {
  std::vector<Block> out;
  std::istringstream in(read_file(path).value_or(""));
  std::string line;
  int n = 0;
  Block* open = nullptr;
  while (std::getline(in, line)) {
    ++n;
    if (!open && line.rfind("```toml", 0) == 0) {
      out.push_back({path + ":" + std::to_string(n), ""});
      open = &out.back();
    } else if (open && line.rfind("```", 0) == 0) {
      open = nullptr;
    } else if (open) {
      open->text += line + "\n";
    }
  }
  EXPECT_EQ(open, nullptr) << path << ": an unclosed ```toml block";
  return out;
}

// What a TOML example shows, by where it is.
enum class Kind { kJob, kProfile, kAgent, kControlPlane, kSidekick, kHcs, kWeftctl, kUnknown };

// Only whether it parsed, and the error.
template <class T>
Status status_of(const Result<T>& r) {
  return r.ok() ? Status{} : Status{r.error()};
}

Status check(Kind k, const std::string& text, const std::string& name) {
  switch (k) {
    case Kind::kJob:
      return status_of(parse_job_file(text, name));
    case Kind::kProfile:
      return status_of(sidekick::parse_profile_text(text, name));
    case Kind::kAgent:
      return status_of(agent::parse_agent_config(text, name));
    case Kind::kControlPlane:
      return status_of(cp::parse_cp_config(text, name));
    case Kind::kSidekick:
      return status_of(sidekick::parse_sidekick_config(text, name));
    case Kind::kHcs:
      return status_of(hcs::parse_hcs_config(text, name));
    case Kind::kWeftctl:
      return status_of(parse_cli_config(text, name));
    case Kind::kUnknown:
      break;
  }
  return make_error("no checker knows what this example shows: add one to " __FILE__);
}

Kind kind_of_doc(const std::string& file) {
  if (file == "jobs.md" || file == "services.md" || file == "rebalancer.md") return Kind::kJob;
  if (file == "profiles.md") return Kind::kProfile;
  if (file == "health.md") return Kind::kHcs;
  return Kind::kUnknown;
}

// A block whose first line is a comment naming the file it belongs in ("# in
// controlplane.toml", "# a job file") is checked as that file; others by the document
// they are in.
Kind kind_of_block(const std::string& file, const std::string& text) {
  std::string first = text.substr(0, text.find('\n'));
  if (first.rfind("#", 0) == 0)
    for (auto [name, kind] : {std::pair{"controlplane.toml", Kind::kControlPlane},
                              {"weftctl.toml", Kind::kWeftctl},
                              {"agent.toml", Kind::kAgent},
                              {"sidekick.toml", Kind::kSidekick},
                              {"hcs.toml", Kind::kHcs},
                              {"a job file", Kind::kJob}})
      if (first.find(name) != std::string::npos) return kind;
  return kind_of_doc(file);
}

const std::string kSrc = WEFT_SOURCE_DIR;

TEST(DocsExamples, EveryTomlBlockInTheDocsParses) {
  std::vector<std::string> docs = {kSrc + "/README.md"};
  for (const auto& e : fs::directory_iterator(kSrc + "/docs"))
    if (e.path().extension() == ".md") docs.push_back(e.path());
  int checked = 0;
  for (const auto& doc : docs) {
    for (const auto& b : toml_blocks(doc)) {
      Status s = check(kind_of_block(fs::path(doc).filename(), b.text), b.text, b.where);
      EXPECT_TRUE(s.ok()) << b.where << ": " << s.error().str() << "\n" << b.text;
      ++checked;
    }
  }
  // The guides that show TOML: jobs, profiles, health. A test that found nothing to
  // check would pass for the wrong reason.
  EXPECT_GE(checked, 3);
}

TEST(DocsExamples, ExamplesShippedConfigsAndProfilesParse) {
  int checked = 0;
  auto expect_parses = [&](Kind k, const std::string& path) {
    auto text = read_file(path);
    ASSERT_TRUE(text.ok()) << path;
    Status s = check(k, *text, path);
    EXPECT_TRUE(s.ok()) << path << ": " << s.error().str();
    ++checked;
  };
  for (const auto& e : fs::directory_iterator(kSrc + "/examples")) {
    std::string name = e.path().filename();
    if (name.size() > 9 && name.substr(name.size() - 9) == ".job.toml")
      expect_parses(Kind::kJob, e.path());
    else if (e.path().extension() == ".toml")
      expect_parses(Kind::kProfile, e.path());  // examples/dev.toml: the demo's profile
    else if (name == "shard_controller")
      continue;  // a program: built with the tree, run by ControlPlane.TheShardController...
    else
      ADD_FAILURE() << e.path() << ": an example no test checks";
  }
  for (const auto& e : fs::directory_iterator(kSrc + "/profiles"))
    expect_parses(Kind::kProfile, e.path());
  expect_parses(Kind::kAgent, kSrc + "/packaging/agent.toml");
  expect_parses(Kind::kControlPlane, kSrc + "/packaging/controlplane.toml");
  expect_parses(Kind::kSidekick, kSrc + "/packaging/sidekick.toml");
  expect_parses(Kind::kHcs, kSrc + "/packaging/hcs.toml");
  EXPECT_GE(checked, 11);
}

// The checker is not a rubber stamp: the example of the old docs/jobs.md, whose
// `limits` no agent knows, is refused at its line.
TEST(DocsExamples, TheCheckerRefusesTheOldJobsGuideExample) {
  Status s = check(Kind::kJob,
                   "name = \"web\"\nentitlement = \"frontend\"\n[task]\nargv = [\"/bin/true\"]\n"
                   "limits = { memory_max = \"256M\", pids_max = 256 }\n",
                   "old.toml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().str().find("old.toml:5"), std::string::npos) << s.error().str();
  EXPECT_FALSE(check(Kind::kUnknown, "", "x").ok());
}

}  // namespace
}  // namespace weft
