// The machine's own limits for `bench roofline`: a streaming-read probe (memory bandwidth) and an FMA
// probe (the vector FMA peak), plus the timing helpers the roofline's kernel timings share (cold-cache
// best-of-N wall times).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

#include "base/host_memory.h"

namespace m3::bench {

// Machine limits from the probes.
struct MachineLimits {
  double read_gbs = 0;   // GB/s (1e9 bytes/s), streaming read over a buffer >> caches
  double fma_gflops = 0; // GFLOP/s (an FMA is 2 FLOPs), all threads
  std::string isa;      // the probes' vector ISA: the widest this CPU has
  int fma_lanes = 8;    // fp32 lanes per FMA of the FMA probe
  int threads = 1;
};

MachineLimits measure_limits(double probe_mib, int threads);

// Seconds on a steady clock.
double now_s();

// Best wall time of `reps` runs of fn, each from cold caches (a decode step reads each weight once, so
// a warm repeat would overstate its bandwidth).
double best_time(int reps, const std::function<void()>& fn);

// Keeps a computed value alive so the compiler cannot drop the work that produced it.
void keep(float value);

// The streaming-read probe over its own buffer (first touched by the thread that reads each slice):
// measure_limits' figure, and the paired probes that the steady decode is set against.
class ReadProbe {
 public:
  ReadProbe(double mib, int threads);
  // GB/s of the best of passes - 1 timed passes after an untimed one.
  double gbs(int passes);
  // GB/s of one timed pass (after the first: the buffer's pages mapped and in the TLB).
  double pass_gbs();

 private:
  size_t n_;
  int threads_;
  HugePageBuffer mem_;
};

}  // namespace m3::bench
