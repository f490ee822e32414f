// tools/common/cli.h: what the command-line tools share around CLI11: one
// parse step with the tools' exit-code convention. Header only; a tool adds
// ${CMAKE_SOURCE_DIR}/tools to its include path and includes "common/cli.h".
//
// Thread safety: called from main, before the tool starts any thread.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace pmindex::tools {

// The exit codes of every pmindex tool (pmbench, pmcheck, pmindex-pool,
// pmkv; docs/CONTRIBUTING.md "Tool exit codes"):
inline constexpr int kExitOk = 0;         // success; nothing found
inline constexpr int kExitFound = 1;      // the tool ran and found a problem (failures, corruption, an operation failed)
inline constexpr int kExitUsage = 2;      // bad command line: unknown option, bad or out-of-range value, unknown name
inline constexpr int kExitCannotRun = 3;  // the work could not start: missing or busy pool, I/O error

// A validator for counts and sizes parsed into unsigned types, where CLI11
// would otherwise wrap "-5" to 2^64 - 5 or print its floating-point range:
// "--records: must not be negative, got -5".
inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        const size_t p = v.find_first_not_of(" \t");
        if (p != std::string::npos && v[p] == '-') return "must not be negative, got " + v;
        return {};
      },
      "NON-NEGATIVE");
}

// Parses argv into app. Returns nothing when the tool should go on, else the
// code main returns: 0 after --help or --help-all (printed to stdout), or
// usage_code after a parse error (the message and a hint on stderr).
inline std::optional<int> ParseArgs(CLI::App& app, int argc, char** argv, int usage_code) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return usage_code;
  }
  return std::nullopt;
}

}  // namespace pmindex::tools
