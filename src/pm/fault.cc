// Named fault switches (see pmindex/pm/fault.h).
#include "pmindex/pm/fault.h"

#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

namespace pmindex::pm {

namespace {
std::mutex& Mu() {
  static std::mutex m;
  return m;
}
std::set<std::string>& Set() {
  static std::set<std::string> s;
  return s;
}
struct EnvInit {
  EnvInit() {
    if (const char* e = std::getenv("PMINDEX_FAULTS")) {
      std::stringstream ss(e);
      std::string item;
      while (std::getline(ss, item, ','))
        if (!item.empty()) EnableFault(item);
    }
  }
};
}  // namespace

namespace detail {
std::atomic<bool> g_any_fault{false};
bool FaultEnabledSlow(const char* name) {
  std::lock_guard<std::mutex> g(Mu());
  return Set().count(name) != 0;
}
}  // namespace detail

void EnableFault(const std::string& name) {
  std::lock_guard<std::mutex> g(Mu());
  Set().insert(name);
  detail::g_any_fault.store(true);
}
void DisableFault(const std::string& name) {
  std::lock_guard<std::mutex> g(Mu());
  Set().erase(name);
  detail::g_any_fault.store(!Set().empty());
}
void DisableAllFaults() {
  std::lock_guard<std::mutex> g(Mu());
  Set().clear();
  detail::g_any_fault.store(false);
}
std::vector<std::string> EnabledFaults() {
  std::lock_guard<std::mutex> g(Mu());
  return {Set().begin(), Set().end()};
}

static EnvInit g_env_init;

}  // namespace pmindex::pm
