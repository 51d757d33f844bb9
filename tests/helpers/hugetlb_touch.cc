// Test helper: maps N huge pages of 2 MiB and touches them one by one, printing
// progress, so a hugetlb cgroup limit shows up as SIGBUS at the first page over it.
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hugetlb_touch PAGES\n");
    return 2;
  }
  const size_t page = 2u << 20;
  const size_t pages = std::strtoul(argv[1], nullptr, 10);
  void* p = mmap(nullptr, pages * page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (p == MAP_FAILED) {
    std::printf("mmap failed: %s\n", std::strerror(errno));
    return 3;
  }
  for (size_t i = 0; i < pages; ++i) {
    static_cast<volatile char*>(p)[i * page] = 1;
    std::printf("touched %zu\n", i + 1);
    std::fflush(stdout);
  }
  return 0;
}
