// argparse-style long-option prefixes (see option_prefixes.h).
#include "cli/option_prefixes.h"

#include <algorithm>

#include "base/error.h"

namespace m3::cli {

void expand_option_prefixes(const CLI::App& sub, std::vector<std::string>& args, size_t from) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : sub.get_options())
    for (const std::string& n : opt->get_lnames()) names.push_back(n);
  for (size_t i = from; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    const std::string given = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (std::find(names.begin(), names.end(), given) != names.end()) continue;
    std::vector<std::string> hits;
    for (const std::string& n : names)
      if (n.rfind(given, 0) == 0) hits.push_back(n);
    if (hits.size() == 1) {
      a = "--" + hits[0] + (eq == std::string::npos ? "" : a.substr(eq));
    } else if (hits.size() > 1) {
      std::string list;
      for (const std::string& h : hits) list += (list.empty() ? "--" : ", --") + h;
      throw Error("ambiguous option: --" + given + " could match " + list);
    }
  }
}

}  // namespace m3::cli
