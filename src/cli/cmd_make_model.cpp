// Placeholder until the make_model command lands.
#include "cli/commands.h"

namespace m3::cli {
void register_make_model(CLI::App& app) { (void)app; }
}  // namespace m3::cli
