#include "agent/task_identities.h"

#include "agent/manager.h"

namespace weft::agent {

using json = nlohmann::json;

Status TaskIdentities::assign_ports(TaskSpec* spec) {
  if (spec->ports.empty()) return {};
  auto holder = [this, spec](uint16_t port) -> std::string {
    for (const auto& [id, t] : m_.tasks_) {
      if (t->spec.name == spec->name || !task_present_on_machine(t->state)) continue;
      for (const auto& [name, p] : t->spec.ports)
        if (p == port) return t->spec.name;
    }
    return "";
  };
  // The machine's own ports (its listeners, weft's, the operator's reserved_ports) are
  // never a task's: published, they would answer in the machine's place.
  HostPorts machine = host_ports_of(m_.cfg_);
  return resolve_task_ports(spec, m_.cfg_.port_first, m_.cfg_.port_last, holder, &next_port_,
                            [&machine](uint16_t port) { return machine.why_reserved(port); });
}

void TaskIdentities::release_own_uid(const std::string& id) {
  auto it = m_.tasks_.find(id);
  if (it == m_.tasks_.end() || it->second->own_uid < 0) return;
  own_uids_.release(id);
  it->second->own_uid = -1;
}

Result<Identity> TaskIdentities::identity_of(Task* t, const TaskSpec& spec,
                                             const std::vector<std::string>* image_roots) {
  Identity id;
  if (spec.user.empty() && !m_.cfg_.default_task_user) {
    long uid = t ? t->own_uid : m_.cfg_.task_uid_first;
    if (uid < 0) {
      // The next free uid of the range, in turn from where the last one was handed out.
      auto free = own_uids_.next_free();
      if (!free)
        return make_error("every uid of task_uids (" + std::to_string(m_.cfg_.task_uid_first) +
                          "-" + std::to_string(m_.cfg_.task_uid_last) + ") is a live task's");
      uid = static_cast<long>(*free);
    }
    // A group the spec names is the task's primary group; its uid's own number otherwise.
    TRY_ASSIGN(id, task_identity(std::to_string(uid), spec.group, "", m_.cfg_.allow_root_tasks));
    if (t && t->own_uid < 0 && own_uids_.hold(static_cast<uint64_t>(uid), t->id)) t->own_uid = uid;
  } else {
    TRY_ASSIGN(id, task_identity(spec.user, spec.group, m_.cfg_.default_task_user.value_or(""),
                                 m_.cfg_.allow_root_tasks, image_roots));
  }
  // The group of the local sockets makes any process an admin of this machine's daemons.
  bool sockets_group = weft_gid_ >= 0 && id.gid == weft_gid_;
  for (gid_t g : id.groups) sockets_group = sockets_group || static_cast<int>(g) == weft_gid_;
  if (weft_gid_ >= 0 && sockets_group)
    return field_error("group", "tasks never run with group " + m_.cfg_.socket_group +
                                    " (the group of weft's local sockets)");
  return id;
}

}  // namespace weft::agent
