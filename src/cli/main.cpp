// m3serve entry point: dispatches to the subcommands and turns errors into one clear message
// plus a non-zero exit code.
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/option_prefixes.h"
#include "base/error.h"
#include "base/version.h"

int main(int argc, char** argv) {
  // A step is many short parallel regions. OpenMP threads that spin long at barriers lose badly
  // whenever another process shares the cores; threads that sleep at once (the passive policy) pay
  // a wake-up per region. A short spin (GOMP_SPINCOUNT=2000, about 20 us) catches the gaps inside a
  // step and then sleeps: faster than passive alone on the machine, and no worse beside a busy process,
  // where longer spins lose (docs/benchmarks.md section 3.4). libgomp reads these before main() runs,
  // so unless the user chose a policy or a spin count (OMP_WAIT_POLICY=active is best on a dedicated
  // machine), restart once with it.
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    ::setenv("GOMP_SPINCOUNT", "2000", 1);
    ::execv("/proc/self/exe", argv);  // only returns on failure: carry on with the default policy
  }
  // The restart above runs /proc/self/exe, which names the process "exe" (ps, pgrep -x, killall): give it
  // its own name back.
  if (const char* base = std::strrchr(argv[0], '/')) ::prctl(PR_SET_NAME, base + 1, 0, 0, 0);
  else ::prctl(PR_SET_NAME, argv[0], 0, 0, 0);
  CLI::App app{"m3serve: inference engine and OpenAI-compatible server for MiniMax-M3 / M3.1"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", m3::kVersion);
  // As vLLM's argparse: an option given twice takes its last value (recipes append per-hardware
  // arguments to a base command). List options (--served-model-name, --numa-bind-nodes) keep all.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  m3::cli::register_generate(app);
  m3::cli::register_logits(app);
  m3::cli::register_tokenize(app);
  m3::cli::register_make_model(app);
  m3::cli::register_serve(app);
  m3::cli::register_bench(app);
  m3::cli::register_proxy(app);
  // vLLM's multi-letter short flags (-tp 4, -dp 2) are not expressible in CLI11; spell them out.
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args) {
    for (const auto& [shortf, longf] : {std::pair<std::string, std::string>{"-tp", "--tensor-parallel-size"},
                                        {"-dp", "--data-parallel-size"}}) {
      if (a == shortf) a = longf;
      else if (a.rfind(shortf + "=", 0) == 0) a = longf + a.substr(shortf.size());
    }
  }
  std::vector<char*> cargs;
  try {
    // `bench serve` takes argparse's abbreviations, as the `vllm bench serve` lines users paste.
    if (args.size() > 2 && args[1] == "bench" && args[2] == "serve")
      m3::cli::expand_option_prefixes(*app.get_subcommand("bench")->get_subcommand("serve"), args, 3);
    for (auto& a : args) cargs.push_back(a.data());
    app.parse(int(cargs.size()), cargs.data());
    if (app.get_subcommands().empty()) {  // `m3serve` alone: the commands, then the error
      std::fprintf(stderr, "%s\nerror: a subcommand is required\n", app.help().c_str());
      return 1;
    }
  } catch (const CLI::ExtrasError& e) {
    // CLI11 lists the extras in reverse ("bfloat16 --dtype") and never says "unknown option"; name them in
    // the order given, options first.
    std::string opts, values;
    const std::string what = e.what();
    for (size_t i = 1; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (what.find(" " + a) == std::string::npos) continue;
      std::string& to = a.rfind("-", 0) == 0 ? opts : values;
      to += (to.empty() ? "" : " ") + a;
    }
    std::string sub;
    for (const CLI::App* s = &app; !s->get_subcommands().empty(); s = s->get_subcommands().front())
      sub += " " + s->get_subcommands().front()->get_name();
    if (!opts.empty())
      std::fprintf(stderr, "error: unknown option%s: %s%s; see 'm3serve%s --help'\n", opts.find(' ') == std::string::npos ? "" : "s",
                   opts.c_str(), values.empty() ? "" : (" (with " + values + ")").c_str(), sub.c_str());
    else
      std::fprintf(stderr, "error: unexpected argument%s: %s; see 'm3serve%s --help'\n",
                   values.find(' ') == std::string::npos ? "" : "s", values.c_str(), sub.c_str());
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const m3::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
