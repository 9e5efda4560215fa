// Placeholder until the generate command lands.
#include "cli/commands.h"

namespace m3::cli {
void register_generate(CLI::App& app) { (void)app; }
}  // namespace m3::cli
