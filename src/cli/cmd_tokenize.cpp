// Placeholder until the tokenize command lands.
#include "cli/commands.h"

namespace m3::cli {
void register_tokenize(CLI::App& app) { (void)app; }
}  // namespace m3::cli
