// Unambiguous prefixes of long options, as Python's argparse accepts them (`--random-input` for
// `--random-input-len`): `vllm bench serve` command lines rely on them, CLI11 has no such rule.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace m3::cli {

// Rewrites args[from..] in place: an argument `--PREFIX` or `--PREFIX=VALUE` that names no long option
// of `sub` exactly but is the prefix of exactly one becomes that option; a prefix of several throws
// m3::Error listing them (as argparse does); anything else is left to the parser. Stops at `--`.
void expand_option_prefixes(const CLI::App& sub, std::vector<std::string>& args, size_t from);

}  // namespace m3::cli
