// pmindex/pm/fault.h: named fault switches for proving the crash checker.
//
// Index code marks persist steps that a deliberately broken variant may skip
// or reorder:
//     if (!PMINDEX_FAULT("fptree.insert.skip_kv_flush")) pm::Flush(kv, n);
// and declares the names it uses once, in one .cc file of its folder:
//     PMINDEX_FAULT_SWITCHES(fptree, "fptree.insert.skip_kv_flush", ...);
// (docs/CONTRIBUTING.md, "Fault switches"). The declarations form a
// process-wide registry filled at static initialisation; FaultKnown answers
// from it, and enabling a name that no folder declared is an error.
//
// Switches exist only in builds configured with -DPMINDEX_FAULT_INJECTION=ON
// (scripts/build.sh, hence the test script and pmcheck's CI, turns it on).
// Without it PMINDEX_FAULT(name) is the constant false, EnableFault returns
// Unsupported, and a non-empty PMINDEX_FAULTS environment variable stops the
// process at start with a message: a switch is never silently off.
//
// With the option, a fault is off unless enabled at run time (tests,
// `pmcheck --fault NAME`, or PMINDEX_FAULTS: comma-separated names, checked
// at the first fault query; an unknown name there prints a message and
// aborts). When no fault is enabled the check is one relaxed load of a
// global flag. A PMINDEX_FAULT query of an undeclared name, made while any
// fault is enabled, aborts: a misspelt switch in index code is found by the
// first run that enables any switch.
//
// Thread-safety: every function may be called from any thread; the registry
// is written only during static initialisation.
#pragma once

#include <atomic>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pmindex/status.h"

#ifndef PMINDEX_FAULT_INJECTION
#define PMINDEX_FAULT_INJECTION 0
#endif

namespace pmindex::pm {

// Whether this build has fault switches compiled in.
inline constexpr bool kFaultInjection = PMINDEX_FAULT_INJECTION != 0;

namespace detail {
extern std::atomic<bool> g_any_fault;
bool FaultEnabledSlow(const char* name);
// Adds names to the registry (PMINDEX_FAULT_SWITCHES).
struct FaultRegistrar {
  FaultRegistrar(std::initializer_list<const char*> names);
  // The same from a folder's constant array of names (PMINDEX_FAULT_SWITCH_ARRAY).
  explicit FaultRegistrar(std::span<const char* const> names);
};
// Parses a PMINDEX_FAULTS value and enables its names; InvalidArgument
// naming the first unknown one (nothing is enabled then).
Status EnableFaultList(std::string_view comma_separated);
}  // namespace detail

// True if some folder declared `name` with PMINDEX_FAULT_SWITCHES (in any
// build, with or without fault injection).
bool FaultKnown(std::string_view name);
// Every declared name, sorted.
std::vector<std::string> KnownFaults();

// Enables a named fault (process-wide). InvalidArgument for an undeclared
// name, Unsupported in a build without PMINDEX_FAULT_INJECTION.
Status EnableFault(std::string_view name);
void DisableFault(std::string_view name);
void DisableAllFaults();
std::vector<std::string> EnabledFaults();

inline bool FaultEnabled(const char* name) {
  return kFaultInjection && __builtin_expect(detail::g_any_fault.load(std::memory_order_relaxed), 0) &&
         detail::FaultEnabledSlow(name);
}

}  // namespace pmindex::pm

#if PMINDEX_FAULT_INJECTION
#define PMINDEX_FAULT(name) (::pmindex::pm::FaultEnabled(name))
#else
#define PMINDEX_FAULT(name) (false)
#endif

// Declares the fault switch names of one folder (an index, the allocator, a
// tool). `id` is an identifier unique in its translation unit; use it once
// per folder, in a .cc file, at namespace scope.
#define PMINDEX_FAULT_SWITCHES(id, ...) \
  static const ::pmindex::pm::detail::FaultRegistrar pmindex_fault_switches_##id { __VA_ARGS__ }
// Declares the names of a constant array the folder also uses elsewhere
// (e.g. its tests iterate it), so the names are written once.
#define PMINDEX_FAULT_SWITCH_ARRAY(id, array) \
  static const ::pmindex::pm::detail::FaultRegistrar pmindex_fault_switches_##id { std::span<const char* const>(array) }
