#include "agent/logs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "agent/logfiles.h"
#include "common/fs.h"

namespace weft::agent {

namespace {

std::string file_of(const std::string& dir, const std::string& stream, unsigned seq) {
  char name[128];
  weft_log_name(name, sizeof name, stream.c_str(), seq);
  return dir + "/" + name;
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

}  // namespace

std::vector<unsigned> log_sequence(const std::string& dir, const std::string& stream) {
  std::vector<unsigned> seqs;
  auto names = list_dir(dir);
  if (!names.ok()) return seqs;
  for (const auto& n : *names) {
    unsigned s;
    if (weft_log_parse_name(n.c_str(), stream.c_str(), &s)) seqs.push_back(s);
  }
  std::sort(seqs.begin(), seqs.end());
  return seqs;
}

LogStats log_stats(const std::string& dir, const std::string& stream) {
  LogStats info;
  for (unsigned s : log_sequence(dir, stream)) {
    ++info.files;
    info.bytes += file_size(file_of(dir, stream, s));
  }
  auto d = read_file(dir + "/" + stream + ".dropped");
  if (d.ok()) info.dropped = std::strtoull(d->c_str(), nullptr, 10);
  return info;
}

Result<LogChunk> read_log(const std::string& dir, const std::string& stream,
                          std::optional<LogCursor> from, size_t max_bytes,
                          std::optional<size_t> tail_lines) {
  LogChunk out;
  auto seqs = log_sequence(dir, stream);
  if (seqs.empty()) {
    out.next = from.value_or(LogCursor{});
    return out;
  }
  LogCursor cur;
  // A tail ends where the files ended when it was found: lines written meanwhile are the
  // next call's (from the cursor), not extra lines of this one.
  std::optional<LogCursor> stop;
  if (from) {
    cur = *from;
    if (cur.seq < seqs.front()) {
      // Rotated away: count what we lost, as far as we can know it.
      out.skipped = 1;
      cur = {seqs.front(), 0};
    }
  } else if (tail_lines) {
    // Newest files first, up to 1 MiB: find where the last N lines begin.
    std::vector<std::pair<unsigned, std::string>> tail_files;
    size_t total = 0;
    for (auto it = seqs.rbegin(); it != seqs.rend() && total < (1u << 20); ++it) {
      auto data = read_file(file_of(dir, stream, *it));
      if (!data.ok()) break;
      total += data->size();
      tail_files.insert(tail_files.begin(), {*it, std::move(*data)});
    }
    std::string all;
    for (const auto& f : tail_files) all += f.second;
    size_t pos = all.size();
    if (pos > 0 && all[pos - 1] == '\n') --pos;  // the final newline ends the last line
    size_t lines = 0;
    while (pos > 0 && lines < *tail_lines) {
      size_t nl = all.rfind('\n', pos - 1);
      if (nl == std::string::npos) {
        pos = 0;
        break;
      }
      if (++lines == *tail_lines) {
        pos = nl + 1;
        break;
      }
      pos = nl;
    }
    if (*tail_lines == 0) pos = all.size();
    if (!tail_files.empty())
      stop = LogCursor{tail_files.back().first, tail_files.back().second.size()};
    // Map the offset in `all` back to (file, offset).
    cur = {seqs.back(), tail_files.empty() ? 0 : tail_files.back().second.size()};
    size_t acc = 0;
    for (const auto& f : tail_files) {
      if (pos < acc + f.second.size() || &f == &tail_files.back()) {
        cur = {f.first, pos - acc};
        break;
      }
      acc += f.second.size();
    }
  } else {
    cur = {seqs.front(), 0};
  }
  while (out.data.size() < max_bytes) {
    if (stop && cur.seq == stop->seq && cur.offset >= stop->offset) break;
    std::string path = file_of(dir, stream, cur.seq);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.valid()) {
      size_t want = max_bytes - out.data.size();
      if (stop && cur.seq == stop->seq)
        want = std::min<size_t>(want, static_cast<size_t>(stop->offset - cur.offset));
      std::string buf(want, '\0');
      ssize_t n = ::pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(cur.offset));
      if (n > 0) {
        out.data.append(buf.data(), static_cast<size_t>(n));
        cur.offset += static_cast<uint64_t>(n);
        continue;
      }
    }
    // End of this file: move on only if a newer one exists.
    auto it = std::upper_bound(seqs.begin(), seqs.end(), cur.seq);
    if (it == seqs.end()) break;
    cur = {*it, 0};
  }
  out.next = cur;
  return out;
}

}  // namespace weft::agent
