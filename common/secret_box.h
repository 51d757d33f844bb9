// Secret values at rest (docs/security.md, "Secrets"): a job's task.env values and
// task.files[].content are sealed with AES-256-GCM (OpenSSL) before the control plane
// writes them to sqlite or etcd, and opened when it reads them back. In memory, and on
// the session to the agent that runs the task, they are plain.
//
// The key file (controlplane.toml `secrets_key`) holds one key per line,
// "<key id> <64 hex digits>" ('#' starts a comment); the first line's key seals, every
// line's key opens what was sealed with it. Rotation: put a new key first, keep the old
// ones below it, restart the control plane (it writes every job again under the new
// key), then the old lines may go.
//
// A sealed value is "weft-sealed:v1:<key id>:<base64(12-byte nonce | ciphertext |
// 16-byte tag)>"; the key id and the value's place (its job and field) are the
// authenticated data, so a sealed value moved to another job or field does not open.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace weft {

class SecretBox {
 public:
  // Reads the key file; refused when others than its owner and group may read it, or
  // when a line is not "<id> <64 hex digits>" (the error names file and line).
  static Result<std::shared_ptr<const SecretBox>> load(const std::string& path);
  static Result<std::shared_ptr<const SecretBox>> parse(std::string_view text,
                                                        const std::string& name);
  // The key file at `path`, made first (one new random key, mode 0600, created
  // exclusively: an existing file is never overwritten) when there is none. For a daemon
  // that seals its own state with a key of its own (weft-agent).
  static Result<std::shared_ptr<const SecretBox>> load_or_create(const std::string& path);

  // `where` (e.g. "web/task.env.DB_PASSWORD") is bound into the seal.
  std::string seal(std::string_view plain, std::string_view where) const;
  Result<std::string> open(std::string_view sealed, std::string_view where) const;
  static bool is_sealed(std::string_view value);
  // The id of the key a sealed value was sealed with ("" when it is not sealed).
  static std::string key_of(std::string_view value);
  const std::string& current_key() const { return keys_.front().first; }

 private:
  SecretBox() = default;
  std::vector<std::pair<std::string, std::string>> keys_;  // id, 32 raw bytes
};

// A job spec's JSON (common/job_spec.h's to_json form) with its secret values sealed:
// task.env values and task.files[].content. Values already sealed stay as they are.
nlohmann::json seal_job_secrets(nlohmann::json job, const SecretBox& box);
// The same opened. Without a box, a sealed value is an error naming the job and field
// (the control plane cannot run a job whose secrets it cannot read).
Result<nlohmann::json> open_job_secrets(nlohmann::json job, const SecretBox* box);
// A task spec's JSON as shown to a reader who may not change it: every `env` value and
// `files[].content` (where secrets go) replaced with "(hidden)".
void hide_task_secrets(nlohmann::json& task);
// Where the job's first secret value is ("pay/task.env.STRIPE_KEY"), sealed or not; ""
// when it has none. A control plane without a key refuses such a job, and refuses to
// start with one in its store: secrets are kept sealed at rest, never in plain text.
std::string first_secret(const nlohmann::json& job);
// True when every secret value of the job is sealed with the box's current key.
bool job_secrets_current(const nlohmann::json& job, const SecretBox& box);

}  // namespace weft
