#include "controlplane/tasks/exec_window.h"

#include <algorithm>

namespace weft::cp {

void ExecWindow::gave(const rpc::Session& to, uint64_t bytes) {
  if (bytes == 0) return;
  delivered_ += bytes;
  if (to.bytes_sent() >= to.bytes_queued()) {
    left_ = delivered_;  // already out: nothing to note
    queued_.clear();
  } else {
    queued_.emplace_back(to.bytes_queued(), delivered_);
  }
}

Result<std::optional<uint64_t>> ExecWindow::ack(const rpc::Session& to, uint64_t claimed) {
  if (claimed > delivered_)
    return make_error("acknowledged " + std::to_string(claimed) + " bytes of output, but " +
                      std::to_string(delivered_) + " were sent");
  const uint64_t sent = to.bytes_sent();
  while (!queued_.empty() && queued_.front().first <= sent) {
    left_ = queued_.front().second;
    queued_.pop_front();
  }
  const uint64_t pass = std::min(claimed, left_);
  if (pass <= acked_) return std::optional<uint64_t>();
  acked_ = pass;
  return std::optional<uint64_t>(pass);
}

using json = nlohmann::json;

namespace {
// The window's worth of bytes in base64, and some room.
constexpr size_t kMaxDataChars = 400 * 1024;
}  // namespace

json exec_input_fields(const json& p) {
  json q = json::object();
  if (auto d = p.find("data");
      d != p.end() && d->is_string() && d->get_ref<const std::string&>().size() <= kMaxDataChars)
    q["data"] = *d;
  for (const char* flag : {"eof", "close"})
    if (auto f = p.find(flag); f != p.end() && f->is_boolean()) q[flag] = *f;
  for (const char* number : {"ack", "rows", "cols"})
    if (auto n = p.find(number); n != p.end() && n->is_number_unsigned()) q[number] = *n;
  return q;
}

json exec_output_fields(const json& p, bool exit) {
  json q = json::object();
  if (exit) {
    if (auto s = p.find("status"); s != p.end() && s->is_number_integer()) q["status"] = *s;
    if (auto e = p.find("error");
        e != p.end() && e->is_string() && e->get_ref<const std::string&>().size() <= 1024)
      q["error"] = *e;
    return q;
  }
  if (auto s = p.find("stream"); s != p.end() && (*s == "stdout" || *s == "stderr"))
    q["stream"] = *s;
  if (auto d = p.find("data");
      d != p.end() && d->is_string() && d->get_ref<const std::string&>().size() <= kMaxDataChars)
    q["data"] = *d;
  if (auto a = p.find("ack"); a != p.end() && a->is_number_unsigned()) q["ack"] = *a;
  return q;
}

uint64_t base64_decoded_size(const std::string& b64) {
  uint64_t n = b64.size() / 4 * 3;
  if (!b64.empty() && b64.back() == '=') --n;
  if (b64.size() > 1 && b64[b64.size() - 2] == '=') --n;
  return n;
}

}  // namespace weft::cp
