#include "agent/host_ports.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"
#include "common/strings.h"

namespace weft::agent {
namespace {

const char* kTcp =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "1 1 0000000000000000 100 0 0 10 0\n"
    "   1: 00000000:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "2 1 0000000000000000 100 0 0 10 0\n"
    "   2: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 "
    "3 1 0000000000000000 20 4 30 10 -1\n"
    "garbage\n"
    "   3: 0100007F:ZZZZ 00000000:0000 0A\n";
const char* kUdp =
    "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode ref pointer drops\n"
    "  100: 0100007F:2198 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        "
    "0 4 2 0000000000000000 0\n"
    "  101: 0100007F:D431 0100007F:0035 01 00000000:00000000 00:00000000 00000000     0        "
    "0 5 2 0000000000000000 0\n";

TEST(HostPorts, ListenersAreReadFromTheKernelsTables) {
  // 0x1F90 = 8080 and 0x08AE = 2222 listen; 0xC350 is a connection, not a listener.
  EXPECT_EQ(parse_proc_net_listeners(kTcp, false), (std::set<uint16_t>{2222, 8080}));
  // 0x2198 = 8600 is bound; 0xD431 is a connected client socket.
  EXPECT_EQ(parse_proc_net_listeners(kUdp, true), (std::set<uint16_t>{8600}));
  EXPECT_TRUE(parse_proc_net_listeners("", false).empty());
  EXPECT_TRUE(parse_proc_net_listeners("header only", true).empty());
}

TEST(HostPorts, ReservedAndListeningPortsAreTheMachinesOwn) {
  const std::string dir =
      std::filesystem::temp_directory_path() / ("weft-hostports-" + random_hex(6));
  struct Remove {
    std::string path;
    ~Remove() { (void)remove_tree(path); }
  } remove{dir};
  ASSERT_TRUE(mkdir_p(dir).ok());
  ASSERT_TRUE(write_file(dir + "/tcp", kTcp).ok());
  ASSERT_TRUE(write_file(dir + "/udp", kUdp).ok());  // no tcp6, udp6: skipped
  HostPorts ports({9471, 7070}, dir);
  EXPECT_NE(ports.why_reserved(9471).find("reserved"), std::string::npos);
  EXPECT_NE(ports.why_reserved(2222).find("listener on the host"), std::string::npos);
  EXPECT_NE(ports.why_reserved(8600).find("listener on the host"), std::string::npos);
  EXPECT_EQ(ports.why_reserved(20001), "");
  EXPECT_EQ(ports.why_reserved(50000), "");  // a connection's port, not a listener's
  EXPECT_EQ(ports.snapshot(), (std::set<uint16_t>{2222, 7070, 8080, 8600, 9471}));
  EXPECT_EQ(ports.snapshot(2), (std::set<uint16_t>{2222, 7070}));
}

}  // namespace
}  // namespace weft::agent
