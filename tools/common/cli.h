// tools/common/cli.h: what the command-line tools share around CLI11: one
// parse step with the tools' exit-code convention. Header only; a tool adds
// ${CMAKE_SOURCE_DIR}/tools to its include path and includes "common/cli.h".
//
// Thread safety: called from main, before the tool starts any thread.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

namespace pmindex::tools {

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
