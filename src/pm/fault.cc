// Named fault switches (include/pmindex/pm/fault.h): the registry of
// declared names, the set of enabled ones, and the PMINDEX_FAULTS variable.
//
// Invariants: every enabled name is declared; g_any_fault is true iff a
// fault is enabled or PMINDEX_FAULTS still waits to be applied.
// The environment is applied lazily (at the first query or change after
// static initialisation), because the registrars of other translation units
// and of the executable may run after this file's.
//
// Thread-safety: the registry is filled during static initialisation (one
// thread); afterwards every access is under Mu().
#include "pmindex/pm/fault.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace pmindex::pm {

namespace {
std::mutex& Mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::set<std::string, std::less<>>& Known() {
  static auto* s = new std::set<std::string, std::less<>>;
  return *s;
}
std::set<std::string, std::less<>>& Enabled() {
  static auto* s = new std::set<std::string, std::less<>>;
  return *s;
}
bool env_pending = false;  // Mu()

// Mu() held.
void ApplyEnvLocked();

Status EnableLocked(std::string_view name) {
  if (!kFaultInjection)
    return Status::Unsupported("fault switch " + std::string(name) +
                               ": this build has no fault switches (configure with -DPMINDEX_FAULT_INJECTION=ON)");
  if (!Known().count(name))
    return Status::InvalidArgument("unknown fault switch " + std::string(name) +
                                   " (no PMINDEX_FAULT_SWITCHES declares it)");
  Enabled().emplace(name);
  detail::g_any_fault.store(true);
  return Status::OK();
}

void ApplyEnvLocked() {
  if (!env_pending) return;
  env_pending = false;
  const char* e = std::getenv("PMINDEX_FAULTS");
  std::string_view list = e ? e : "";
  for (size_t pos = 0; pos <= list.size();) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view item = list.substr(pos, comma - pos);
    if (!item.empty()) {
      if (Status s = EnableLocked(item); !s.ok()) {
        std::fprintf(stderr, "pmindex: PMINDEX_FAULTS: %s\n", s.ToString().c_str());
        std::abort();
      }
    }
    pos = comma + 1;
  }
  detail::g_any_fault.store(!Enabled().empty());
}

struct EnvInit {
  EnvInit() {
    const char* e = std::getenv("PMINDEX_FAULTS");
    if (!e || !*e) return;
    if (!kFaultInjection) {
      std::fprintf(stderr,
                   "pmindex: PMINDEX_FAULTS=%s is set, but this library was built without fault switches "
                   "(configure with -DPMINDEX_FAULT_INJECTION=ON)\n",
                   e);
      std::abort();
    }
    std::lock_guard<std::mutex> g(Mu());
    env_pending = true;
    detail::g_any_fault.store(true);
  }
};
}  // namespace

namespace detail {
std::atomic<bool> g_any_fault{false};

bool FaultEnabledSlow(const char* name) {
  std::lock_guard<std::mutex> g(Mu());
  ApplyEnvLocked();
  if (!Known().count(std::string_view(name))) {
    std::fprintf(stderr, "pmindex: PMINDEX_FAULT(\"%s\"): no PMINDEX_FAULT_SWITCHES declares this name\n", name);
    std::abort();
  }
  return Enabled().count(std::string_view(name)) != 0;
}

FaultRegistrar::FaultRegistrar(std::initializer_list<const char*> names) {
  std::lock_guard<std::mutex> g(Mu());
  for (const char* n : names) Known().emplace(n);
}

FaultRegistrar::FaultRegistrar(std::span<const char* const> names) {
  std::lock_guard<std::mutex> g(Mu());
  for (const char* n : names) Known().emplace(n);
}

Status EnableFaultList(std::string_view list) {
  std::lock_guard<std::mutex> g(Mu());
  ApplyEnvLocked();
  std::vector<std::string_view> items;
  for (size_t pos = 0; pos <= list.size();) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    if (comma > pos) items.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  for (std::string_view item : items)
    if (kFaultInjection && !Known().count(item))
      return Status::InvalidArgument("unknown fault switch " + std::string(item) +
                                     " (no PMINDEX_FAULT_SWITCHES declares it)");
  for (std::string_view item : items) PMINDEX_RETURN_IF_ERROR(EnableLocked(item));
  return Status::OK();
}
}  // namespace detail

bool FaultKnown(std::string_view name) {
  std::lock_guard<std::mutex> g(Mu());
  return Known().count(name) != 0;
}

std::vector<std::string> KnownFaults() {
  std::lock_guard<std::mutex> g(Mu());
  return {Known().begin(), Known().end()};
}

Status EnableFault(std::string_view name) {
  std::lock_guard<std::mutex> g(Mu());
  ApplyEnvLocked();
  return EnableLocked(name);
}
void DisableFault(std::string_view name) {
  std::lock_guard<std::mutex> g(Mu());
  ApplyEnvLocked();
  if (auto it = Enabled().find(name); it != Enabled().end()) Enabled().erase(it);
  detail::g_any_fault.store(!Enabled().empty());
}
void DisableAllFaults() {
  std::lock_guard<std::mutex> g(Mu());
  ApplyEnvLocked();
  Enabled().clear();
  detail::g_any_fault.store(false);
}
std::vector<std::string> EnabledFaults() {
  std::lock_guard<std::mutex> g(Mu());
  ApplyEnvLocked();
  return {Enabled().begin(), Enabled().end()};
}

static EnvInit g_env_init;

}  // namespace pmindex::pm
