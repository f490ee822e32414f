// pmindex/pm/fault.h: named fault switches for proving the crash checker.
//
// Index code marks persist steps that a deliberately broken variant may skip
// or reorder:
//     if (!PMINDEX_FAULT("fptree.insert.skip_kv_flush")) pm::Flush(kv, n);
// A fault is off unless enabled at run time (tests, `pmcheck --fault NAME`,
// or the PMINDEX_FAULTS environment variable: comma-separated names). When
// no fault is enabled the check is one relaxed load of a global flag.
// Every index registers the names it supports in docs/<index>.md; pmcheck's
// tests assert that each one is caught.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace pmindex::pm {

namespace detail {
extern std::atomic<bool> g_any_fault;
bool FaultEnabledSlow(const char* name);
}  // namespace detail

// Enables/disables a named fault (process-wide).
void EnableFault(const std::string& name);
void DisableFault(const std::string& name);
void DisableAllFaults();
std::vector<std::string> EnabledFaults();
// True if some PMINDEX_FAULT call site in this build checks `name`; the
// known names, sorted (src/pm/fault_names.cc).
bool FaultKnown(const std::string& name);
std::vector<std::string> KnownFaults();

inline bool FaultEnabled(const char* name) {
  return __builtin_expect(detail::g_any_fault.load(std::memory_order_relaxed), 0) && detail::FaultEnabledSlow(name);
}

}  // namespace pmindex::pm

#define PMINDEX_FAULT(name) (::pmindex::pm::FaultEnabled(name))
