#include "common/rpc.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>
#include <poll.h>
#include <atomic>
#include <filesystem>
#include <thread>

namespace weft::rpc {
namespace {

TEST(LineReader, SplitsAndSkipsOverlongLines) {
  LineReader r(8);
  std::string line;
  r.feed("ab\ncd", 5);
  EXPECT_EQ(r.next(&line), LineReader::Kind::kLine);
  EXPECT_EQ(line, "ab");
  EXPECT_EQ(r.next(&line), LineReader::Kind::kNone);
  r.feed("\n0123456789abc", 14);
  EXPECT_EQ(r.next(&line), LineReader::Kind::kLine);
  EXPECT_EQ(line, "cd");
  EXPECT_EQ(r.next(&line), LineReader::Kind::kOverflow);
  r.feed("def\nok\n", 7);
  EXPECT_EQ(r.next(&line), LineReader::Kind::kLine);
  EXPECT_EQ(line, "ok");
}

TEST(Endpoint, Parse) {
  EXPECT_TRUE(parse_endpoint("/run/weft/agent.sock")->is_unix);
  EXPECT_EQ(parse_endpoint("unix:/x")->path, "/x");
  auto t = parse_endpoint("127.0.0.1:7000");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->is_unix);
  EXPECT_EQ(t->port, 7000);
  EXPECT_FALSE(parse_endpoint("nonsense").ok());
  EXPECT_FALSE(parse_endpoint("h:99999").ok());
}

// Two sessions on one loop joined by a socketpair: each side calls the other.
TEST(Session, RequestsInBothDirections) {
  auto loop = EventLoop::create();
  ASSERT_TRUE(loop.ok());
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  Dispatcher server_methods, client_methods;
  server_methods.add("math.add", [](const json& p, const CallContext&) -> Result<json> {
    if (!p.contains("a") || !p["a"].is_number()) return field_error("a", "must be a number");
    return json(p["a"].get<int>() + p["b"].get<int>());
  });
  client_methods.add("agent.ping",
                     [](const json&, const CallContext&) -> Result<json> { return json("pong"); });
  Session server(**loop, Fd(sv[0]), Peer{}, &server_methods);
  Session client(**loop, Fd(sv[1]), Peer{}, &client_methods);
  ASSERT_TRUE(server.start().ok());
  ASSERT_TRUE(client.start().ok());

  std::optional<Result<json>> sum, bad, pong, unknown;
  client.call("math.add", {{"a", 2}, {"b", 3}}, [&](Result<json> r) { sum = std::move(r); });
  client.call("math.add", {{"b", 3}}, [&](Result<json> r) { bad = std::move(r); });
  client.call("no.such", {}, [&](Result<json> r) { unknown = std::move(r); });
  server.call("agent.ping", {}, [&](Result<json> r) { pong = std::move(r); });
  for (int i = 0; i < 100 && !(sum && bad && pong && unknown); ++i)
    ASSERT_TRUE((*loop)->run_once(100000).ok());
  ASSERT_TRUE(sum && sum->ok());
  EXPECT_EQ(**sum, 5);
  ASSERT_TRUE(bad && !bad->ok());
  EXPECT_EQ(bad->error().code, kInvalidParams);
  ASSERT_TRUE(unknown && !unknown->ok());
  EXPECT_EQ(unknown->error().code, kMethodNotFound);
  ASSERT_TRUE(pong && pong->ok());
  EXPECT_EQ(**pong, "pong");
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("weft-rpc-" + random_hex(6));
    ASSERT_TRUE(mkdir_p(dir_).ok());
    loop_ = std::move(EventLoop::create()).value();
    methods_.add("echo", [](const json& p, const CallContext& c) -> Result<json> {
      return json{{"params", p}, {"unix", c.peer.is_unix}, {"uid", c.peer.uid}};
    });
    server_ = std::make_unique<Server>(*loop_, &methods_, 4096);
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    server_.reset();
    (void)remove_tree(dir_);
  }
  void serve() {
    thread_ = std::thread([this] {
      while (!stop_) (void)loop_->run_once(20000);
    });
  }
  std::string dir_;
  std::unique_ptr<EventLoop> loop_;
  Dispatcher methods_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

// Raw bytes in, raw line out: what a socat user sees.
static std::string raw_exchange(int fd, const std::string& out) {
  EXPECT_EQ(::write(fd, out.data(), out.size()), static_cast<ssize_t>(out.size()));
  std::string got;
  char c;
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 5000) > 0 && ::read(fd, &c, 1) == 1 && c != '\n') got += c;
  return got;
}

TEST_F(ServerTest, UnixSocketErrorsKeepSessionUsable) {
  std::string path = dir_ + "/s.sock";
  ASSERT_TRUE(server_->listen_unix(path, 0660).ok());
  serve();
  auto fd = connect_endpoint(*parse_endpoint(path));
  ASSERT_TRUE(fd.ok());
  int f = fd->get();
  int fl = fcntl(f, F_GETFL);
  fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
  auto e1 = json::parse(raw_exchange(f, "{not json\n"));
  EXPECT_EQ(e1["error"]["code"], kParseError);
  auto e2 = json::parse(raw_exchange(f, "[1,2]\n"));
  EXPECT_EQ(e2["error"]["code"], kInvalidRequest);
  auto e3 = json::parse(raw_exchange(f, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"nope\"}\n"));
  EXPECT_EQ(e3["error"]["code"], kMethodNotFound);
  EXPECT_EQ(e3["id"], 1);
  auto e4 = json::parse(raw_exchange(f, std::string(5000, 'x') + "\n"));
  EXPECT_EQ(e4["error"]["code"], kLineTooLong);
  auto ok = json::parse(raw_exchange(
      f, "{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"echo\",\"params\":{\"k\":1}}\n"));
  EXPECT_EQ(ok["id"], "a");
  EXPECT_EQ(ok["result"]["params"]["k"], 1);
  EXPECT_EQ(ok["result"]["unix"], true);
  EXPECT_EQ(ok["result"]["uid"], getuid());
}

TEST_F(ServerTest, TcpClient) {
  ASSERT_TRUE(server_->listen_tcp("127.0.0.1", 0).ok());
  ASSERT_NE(server_->tcp_port(), 0);
  serve();
  auto c = Client::connect("127.0.0.1:" + std::to_string(server_->tcp_port()));
  ASSERT_TRUE(c.ok()) << c.error().str();
  auto r = (*c)->call("echo", {{"x", "y"}});
  ASSERT_TRUE(r.ok()) << r.error().str();
  EXPECT_EQ((*r)["params"]["x"], "y");
  EXPECT_EQ((*r)["unix"], false);
  auto bad = (*c)->call("missing", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, kMethodNotFound);
}

TEST_F(ServerTest, RefusesToStealLiveSocket) {
  std::string path = dir_ + "/s.sock";
  ASSERT_TRUE(server_->listen_unix(path, 0660).ok());
  Server other(*loop_, &methods_);
  EXPECT_FALSE(other.listen_unix(path, 0660).ok());
}

}  // namespace
}  // namespace weft::rpc

namespace weft::rpc {
namespace {

// Random and hostile input must never take a server down: every line gets an answer
// (or is a notification) and a valid call still works afterwards.
TEST_F(ServerTest, SurvivesGarbage) {
  methods_.add("strict", [](const json& p, const CallContext&) -> Result<json> {
    // A handler that trusts its input: a type error throws inside nlohmann::json.
    return json(p.at("n").get<int>() + 1);
  });
  std::string path = dir_ + "/g.sock";
  ASSERT_TRUE(server_->listen_unix(path, 0660).ok());
  serve();
  auto fd = connect_endpoint(*parse_endpoint(path));
  ASSERT_TRUE(fd.ok());
  int f = fd->get();
  fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK);
  const char* cases[] = {
      "{}",
      "null",
      "\"str\"",
      "{\"jsonrpc\":\"2.0\"}",
      "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"echo\"}",
      "{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"echo\"}",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":7}",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"strict\",\"params\":{\"n\":\"x\"}}",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"strict\",\"params\":{}}",
      "{\"a\":\"\\ud800\"}",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"echo\",\"params\":{\"deep\":[[[[[[[[[[[[[[[[]]]]]"
      "]]]]]]]]]]}}",
      "\xff\xfe\x00garbage",
      "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":5}"};
  for (const char* c : cases) {
    std::string line = std::string(c) + "\n";
    ASSERT_EQ(::write(f, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  }
  // Random bytes, newline-terminated.
  std::string noise;
  for (int i = 0; i < 2000; ++i) noise += static_cast<char>(random_hex(1)[0] + i);
  noise += "\n";
  ASSERT_EQ(::write(f, noise.data(), noise.size()), static_cast<ssize_t>(noise.size()));
  auto ok = json::parse(
      raw_exchange(
          f, "{\"jsonrpc\":\"2.0\",\"id\":\"last\",\"method\":\"strict\",\"params\":{\"n\":41}}\n"),
      nullptr, false);
  // Errors for the garbage arrive first, in order; read until our reply.
  for (int i = 0; i < 40 && !(ok.is_object() && ok.value("id", json()) == "last"); ++i)
    ok = json::parse(raw_exchange(f, ""), nullptr, false);
  ASSERT_TRUE(ok.is_object());
  EXPECT_EQ(ok["result"], 42);
}

}  // namespace
}  // namespace weft::rpc
