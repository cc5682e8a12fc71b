// Ranks of one job as threads of the test process: the multi-rank lab tests (ddp, sharded_training)
// run each rank's code on a thread, over the cpu backend.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "amplab/dist/world.hpp"
#include "process.hpp"  // free_port

namespace amplab::test {

// Runs rank(world) on `world_size` threads, each a rank of one job (rank 0 hosts the store on a
// free port). Returns each rank's error message ("" where it finished).
inline std::vector<std::string> on_rank_threads(int world_size, const std::function<void(const dist::WorldInfo&)>& rank) {
  const int port = free_port();
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.emplace_back([&, r] {
      try {
        dist::WorldInfo world;
        world.rank = world.local_rank = r;
        world.world_size = world.local_world_size = world_size;
        world.master_port = port;
        rank(world);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

}  // namespace amplab::test
