// Hand-written SVG plot of a serving benchmark's latency distributions (TTFT, TPOT, ITL, E2EL
// histograms with mean / p90 / p99 markers), for `bench serve --plot FILE.svg`.
#pragma once
#include <string>
#include <vector>

#include "bench/metrics.h"

namespace m3::bench {

// Renders the SVG text.
std::string latency_svg(const std::vector<RequestTrace>& traces, const std::string& title);
// Writes it to `path`. Throws m3::Error when the file cannot be written.
void write_latency_svg(const std::string& path, const std::vector<RequestTrace>& traces, const std::string& title);

}  // namespace m3::bench
