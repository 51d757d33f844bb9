// Task log file naming, shared by weft-init (the writer) and the agent (the reader).
// Each stream is a sequence of files "<stream>.<seq, 8 digits>.log" in <task dir>/logs;
// a new file starts when the current one would exceed the size limit, and the oldest
// are deleted beyond the file-count limit, their sizes added to "<stream>.dropped".
// Plain C so weft-init can use it without libstdc++.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void weft_log_name(char* buf, size_t n, const char* stream, unsigned seq) {
  snprintf(buf, n, "%s.%08u.log", stream, seq);
}

// True when `name` is a log file of `stream`; stores its sequence number.
static inline int weft_log_parse_name(const char* name, const char* stream, unsigned* seq) {
  size_t sl = strlen(stream);
  if (strncmp(name, stream, sl) != 0 || name[sl] != '.') return 0;
  const char* p = name + sl + 1;
  char* end = NULL;
  unsigned long v = strtoul(p, &end, 10);
  if (end != p + 8 || strcmp(end, ".log") != 0) return 0;
  *seq = (unsigned)v;
  return 1;
}
