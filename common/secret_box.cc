#include "common/secret_box.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <functional>
#include <memory>

#include "common/base64.h"
#include "common/fs.h"
#include "common/strings.h"

namespace weft {

namespace {

constexpr std::string_view kPrefix = "weft-sealed:v1:";
constexpr size_t kNonce = 12, kTag = 16;

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};

bool valid_key_id(std::string_view id) {
  if (id.empty() || id.size() > 32) return false;
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return false;
  return true;
}

Result<std::string> from_hex(std::string_view hex) {
  if (hex.size() != 64) return make_error("not 64 hex digits");
  std::string out(32, '\0');
  for (size_t i = 0; i < 32; ++i) {
    auto nib = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int hi = nib(hex[2 * i]), lo = nib(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return make_error("not 64 hex digits");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

// Applies `f(value, where)` to each secret value of a job's JSON: task.env values and
// task.files[].content. `f` returns the new value or an error.
using SecretFn = std::function<Result<std::string>(const std::string&, const std::string&)>;
Status each_secret(nlohmann::json& job, const SecretFn& f) {
  std::string name = job.value("name", std::string());
  auto task = job.find("task");
  if (task == job.end() || !task->is_object()) return {};
  if (auto env = task->find("env"); env != task->end() && env->is_object())
    for (auto& [k, v] : env->items())
      if (v.is_string()) {
        TRY_ASSIGN(std::string out, f(v.get<std::string>(), name + "/task.env." + k));
        v = std::move(out);
      }
  if (auto files = task->find("files"); files != task->end() && files->is_array())
    for (size_t i = 0; i < files->size(); ++i) {
      auto& file = (*files)[i];
      if (!file.is_object()) continue;
      auto content = file.find("content");
      if (content == file.end() || !content->is_string()) continue;
      TRY_ASSIGN(std::string out, f(content->get<std::string>(),
                                    name + "/task.files[" + std::to_string(i) + "].content"));
      *content = std::move(out);
    }
  return {};
}

}  // namespace

Result<std::shared_ptr<const SecretBox>> SecretBox::load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return sys_error("secrets_key " + path);
  if (st.st_mode & S_IROTH)
    return field_error("secrets_key", "'" + path + "' is readable by every user: chmod 0600");
  TRY_ASSIGN(std::string text, read_file_bounded(path, 64 << 10));
  return parse(text, path);
}

Result<std::shared_ptr<const SecretBox>> SecretBox::load_or_create(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return sys_error("secrets key " + path);
    std::string line = "k" + random_hex(4) + " " + random_hex(32) + "\n";
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno != EEXIST) return sys_error("making the secrets key " + path);
    if (fd >= 0) {
      bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                ::fsync(fd) == 0;
      ::close(fd);
      if (!ok) {
        (void)::unlink(path.c_str());
        return sys_error("writing the secrets key " + path);
      }
    }
  }
  return load(path);
}

Result<std::shared_ptr<const SecretBox>> SecretBox::parse(std::string_view text,
                                                          const std::string& name) {
  std::shared_ptr<SecretBox> box(new SecretBox());
  size_t line_no = 0;
  for (const auto& raw : split(std::string(text), '\n')) {
    ++line_no;
    std::string line = trim(raw.substr(0, raw.find('#')));
    if (line.empty()) continue;
    std::string where = name + ":" + std::to_string(line_no);
    auto parts = split(line, ' ');
    std::erase_if(parts, [](const std::string& p) { return p.empty(); });
    if (parts.size() != 2 || !valid_key_id(parts[0]))
      return field_error(where, "a key line is: <key id> <64 hex digits>");
    auto key = from_hex(parts[1]);
    if (!key.ok()) return field_error(where, "the key is " + key.error().message);
    for (const auto& [id, k] : box->keys_)
      if (id == parts[0]) return field_error(where, "key id '" + id + "' appears twice");
    box->keys_.emplace_back(parts[0], std::move(key).value());
  }
  if (box->keys_.empty()) return field_error(name, "holds no key");
  return std::shared_ptr<const SecretBox>(std::move(box));
}

bool SecretBox::is_sealed(std::string_view v) {
  return v.substr(0, kPrefix.size()) == kPrefix;
}

std::string SecretBox::key_of(std::string_view v) {
  if (!is_sealed(v)) return "";
  v.remove_prefix(kPrefix.size());
  return std::string(v.substr(0, v.find(':')));
}

std::string SecretBox::seal(std::string_view plain, std::string_view where) const {
  const auto& [id, key] = keys_.front();
  std::string aad = id + "\n" + std::string(where);
  std::string out(kNonce + plain.size() + kTag, '\0');
  auto* buf = reinterpret_cast<unsigned char*>(out.data());
  std::unique_ptr<EVP_CIPHER_CTX, CtxFree> ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  bool ok =
      ctx && RAND_bytes(buf, kNonce) == 1 &&
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key.data()), buf) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      EVP_EncryptUpdate(ctx.get(), buf + kNonce, &n,
                        reinterpret_cast<const unsigned char*>(plain.data()),
                        static_cast<int>(plain.size())) == 1 &&
      EVP_EncryptFinal_ex(ctx.get(), buf + kNonce + n, &n) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTag, buf + kNonce + plain.size()) == 1;
  // Without randomness or a cipher nothing may be written in the clear: abort, as a
  // daemon that cannot keep its promise should (OpenSSL fails so only when broken).
  if (!ok) std::abort();
  return std::string(kPrefix) + id + ":" + base64_encode(out);
}

Result<std::string> SecretBox::open(std::string_view sealed, std::string_view where) const {
  if (!is_sealed(sealed)) return std::string(sealed);
  std::string id = key_of(sealed);
  std::string_view body = sealed.substr(kPrefix.size() + id.size() + 1);
  const std::string* key = nullptr;
  for (const auto& [kid, k] : keys_)
    if (kid == id) key = &k;
  if (!key)
    return make_error(std::string(where) + " was sealed with key '" + id.substr(0, 32) +
                      "', which the secrets_key file does not hold");
  auto raw = base64_decode(body);
  if (!raw.ok() || raw->size() < kNonce + kTag)
    return make_error(std::string(where) + ": a sealed value that is not well formed");
  size_t len = raw->size() - kNonce - kTag;
  auto* buf = reinterpret_cast<unsigned char*>(raw->data());
  std::string aad = id + "\n" + std::string(where);
  std::string out(len, '\0');
  std::unique_ptr<EVP_CIPHER_CTX, CtxFree> ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  bool ok =
      ctx &&
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key->data()), buf) == 1 &&
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n, buf + kNonce,
                        static_cast<int>(len)) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTag, buf + kNonce + len) == 1 &&
      EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(out.data()) + n, &n) == 1;
  if (!ok)
    return make_error(std::string(where) +
                      ": the sealed value does not open (another key, altered, or moved)");
  return out;
}

nlohmann::json seal_job_secrets(nlohmann::json job, const SecretBox& box) {
  (void)each_secret(job,
                    [&](const std::string& v, const std::string& where) -> Result<std::string> {
                      if (SecretBox::is_sealed(v)) return v;
                      return box.seal(v, where);
                    });
  return job;
}

Result<nlohmann::json> open_job_secrets(nlohmann::json job, const SecretBox* box) {
  TRY(each_secret(job, [&](const std::string& v, const std::string& where) -> Result<std::string> {
    if (!SecretBox::is_sealed(v)) return v;
    if (!box) return make_error(where + " is sealed, and this control plane has no secrets_key");
    return box->open(v, where);
  }));
  return job;
}

void hide_task_secrets(nlohmann::json& task) {
  if (!task.is_object()) return;
  if (auto env = task.find("env"); env != task.end() && env->is_object())
    for (auto& [k, v] : env->items()) v = "(hidden)";
  if (auto files = task.find("files"); files != task.end() && files->is_array())
    for (auto& f : *files)
      if (f.is_object() && f.contains("content")) f["content"] = "(hidden)";
}

std::string first_secret(const nlohmann::json& job) {
  nlohmann::json copy = job;
  std::string found;
  (void)each_secret(copy,
                    [&](const std::string& v, const std::string& where) -> Result<std::string> {
                      if (found.empty()) found = where;
                      return v;
                    });
  return found;
}

bool job_secrets_current(const nlohmann::json& job, const SecretBox& box) {
  nlohmann::json copy = job;
  bool current = true;
  (void)each_secret(copy, [&](const std::string& v, const std::string&) -> Result<std::string> {
    current = current && SecretBox::key_of(v) == box.current_key();
    return v;
  });
  return current;
}

}  // namespace weft
