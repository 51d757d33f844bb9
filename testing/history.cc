#include "testing/history.h"

#include <algorithm>
#include <set>
#include <sstream>

namespace weft::testing {

namespace {

std::string us_text(uint64_t us) {
  std::ostringstream o;
  o << us / 1000 << " ms";
  return o.str();
}

}  // namespace

std::vector<std::string> History::check(const Final& after) const {
  std::vector<std::string> bad;
  // Two copies of an at-most-one index at one instant: sorted by start, each copy must
  // have ended before the next began (a copy still running ends at "never").
  std::map<std::pair<std::string, int>, std::vector<const Copy*>> by_index;
  for (const Copy& c : copies_)
    if (at_most_one_.count(c.job)) by_index[{c.job, c.index}].push_back(&c);
  for (auto& [key, list] : by_index) {
    std::sort(list.begin(), list.end(),
              [](const Copy* a, const Copy* b) { return a->began_us < b->began_us; });
    for (size_t i = 1; i < list.size(); ++i) {
      const Copy& prev = *list[i - 1];
      const Copy& next = *list[i];
      if (prev.ended_us == 0 || prev.ended_us >= next.began_us)
        bad.push_back("two copies of " + key.first + " index " + std::to_string(key.second) +
                      " at once: " + prev.task_id + " on " + prev.machine + " (ended " +
                      (prev.ended_us ? us_text(prev.ended_us) : std::string("never")) + ") and " +
                      next.task_id + " on " + next.machine + " (began " + us_text(next.began_us) +
                      ")");
    }
  }
  // What the acknowledged calls leave: the last acknowledged create/scale sets the
  // count, a stop ends the job; unacknowledged calls may or may not have happened.
  std::map<std::string, int> want;  // job -> count (-1: stopped)
  std::map<std::string, std::set<int>> indexes;
  for (const Call& c : calls_) {
    if (!c.ok) continue;
    if (c.kind == "create" || c.kind == "scale")
      want[c.job] = c.count;
    else if (c.kind == "stop")
      want[c.job] = -1;
    else if (c.kind == "update" && !want.count(c.job))
      want[c.job] = 0;  // an update of a job this history did not create: it must exist
  }
  // Any index a create or scale asked for, acknowledged or not (an unanswered call may
  // have been done).
  std::map<std::string, int> most;
  for (const Call& c : calls_)
    if (c.kind == "create" || c.kind == "scale") most[c.job] = std::max(most[c.job], c.count);
  for (const auto& [job, count] : want) {
    bool exists = after.exists.count(job) && after.exists.at(job);
    if (count < 0) continue;  // stopped: gone or ending, either is sound
    if (!exists) {
      bad.push_back("acknowledged job " + job + " is gone after healing");
      continue;
    }
    int running = after.running.count(job) ? after.running.at(job) : 0;
    if (count > 0 && running != count)
      bad.push_back("job " + job + " runs " + std::to_string(running) + " copies after healing, " +
                    "not the " + std::to_string(count) + " it was last acknowledged at");
  }
  // A copy no decision asked for: of a job never created, or an index it never had.
  for (const Copy& c : copies_) {
    auto m = most.find(c.job);
    if (m == most.end())
      bad.push_back("task " + c.task_id + " on " + c.machine + " is of no job anyone created");
    else if (c.index < 0 || c.index >= m->second)
      bad.push_back("task " + c.task_id + " on " + c.machine + " is index " +
                    std::to_string(c.index) + " of " + c.job + ", which never had more than " +
                    std::to_string(m->second));
  }
  for (const Fault& f : faults_)
    if (f.healed_us == 0) bad.push_back("fault not healed: " + f.what);
  return bad;
}

std::map<std::string, int> History::fault_counts() const {
  std::map<std::string, int> out;
  for (const Fault& f : faults_) ++out[f.what.substr(0, f.what.find(':'))];
  return out;
}

std::string History::dump() const {
  std::ostringstream o;
  for (const Call& c : calls_)
    o << us_text(c.at_us) << "  call " << c.kind << " " << c.job << " " << c.count
      << (c.ok ? " ok" : " unanswered") << "\n";
  for (const Fault& f : faults_)
    o << us_text(f.made_us) << "  fault " << f.what << " healed "
      << (f.healed_us ? us_text(f.healed_us) : std::string("never")) << "\n";
  for (const Copy& c : copies_)
    o << us_text(c.began_us) << "  copy " << c.task_id << " on " << c.machine << " until "
      << (c.ended_us ? us_text(c.ended_us) : std::string("running")) << "\n";
  return o.str();
}

}  // namespace weft::testing
