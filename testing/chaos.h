// A bounded chaos run's length and seed, the same for every chaos test: WEFT_CHAOS_SECONDS
// (40 by default; longer on demand, scripts/soak.sh) and WEFT_CHAOS_SEED (random by
// default), the seed recorded as the test's "seed" property so that a failure can be run
// again with it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace weft::testing {

struct ChaosRun {
  double seconds = 40;
  uint64_t seed = 0;
  std::mt19937_64 rng;
};

inline ChaosRun chaos_run() {
  ChaosRun r;
  if (const char* e = std::getenv("WEFT_CHAOS_SECONDS")) r.seconds = std::atof(e);
  r.seed = std::random_device{}();
  if (const char* e = std::getenv("WEFT_CHAOS_SEED")) r.seed = std::strtoull(e, nullptr, 10);
  ::testing::Test::RecordProperty("seed", std::to_string(r.seed));
  r.rng.seed(r.seed);
  return r;
}

}  // namespace weft::testing
