/* The program start_bench runs as the task, under weft and under crun alike: it writes
 * one byte to the fifo named by argv[1] (the benchmark's clock stops when that byte
 * arrives) and then waits to be stopped. Static, for a busybox rootfs. */
#include <fcntl.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  int fd = open(argv[1], O_WRONLY);
  if (fd < 0 || write(fd, "x", 1) != 1) return 1;
  close(fd);
  for (;;) pause();
}
