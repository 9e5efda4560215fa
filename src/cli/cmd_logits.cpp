// Placeholder until the logits command lands.
#include "cli/commands.h"

namespace m3::cli {
void register_logits(CLI::App& app) { (void)app; }
}  // namespace m3::cli
