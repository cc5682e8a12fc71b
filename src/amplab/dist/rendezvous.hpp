// Internal to the dist backends: where ranks meet (rank 0's c10d::TCPStore) and a numbered
// "post my bytes, read the others'" exchange over it, with timeouts that name missing ranks.
// The cpu backend builds every collective on StoreExchange; nccl uses it for metadata only.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "amplab/dist/world.hpp"

namespace amplab::dist::detail {

std::chrono::milliseconds to_timeout(double seconds);
std::string format_seconds(std::chrono::milliseconds timeout);  // "2 s", "0.5 s"
std::string format_ranks(const std::vector<int>& ranks);        // "rank 2", "ranks 1, 3"

// Rank 0 hosts a TCPStore at world.master_port; the others connect to master_addr (retrying
// until `timeout`). Errors say who could not host or reach the store, and what to check.
c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world, std::chrono::milliseconds timeout);

// Rounds of byte exchange. Round n uses keys <prefix><n>/<rank>; the last rank to finish reading
// a round deletes its keys, so a long run does not grow the store. TCPStore's (libuv) server
// refuses messages over 8 MiB, so larger posts travel in chunks of kChunkBytes. Not
// thread-safe: one thread drives it (the cpu backend's worker, or the caller for nccl).
class StoreExchange {
 public:
  StoreExchange(c10::intrusive_ptr<c10d::Store> store, const WorldInfo& world, std::chrono::milliseconds timeout,
                std::string prefix);

  // One round: this rank posts `mine` when `post` is true, then reads the bytes posted by each
  // rank in `from` (in that order; this rank's own come from `mine`). Every rank in `from` must
  // post in this round, and only they. `what` names the
  // operation in errors, e.g. "cpu all-reduce #12".
  // `hint` ends a timeout's message (what the user should check).
  std::vector<std::string> round(const std::string& what, bool post, const std::string& mine,
                                 const std::vector<int>& from, const std::string& hint = kCollectiveHint);
  // Every rank posts; returns all, indexed by rank.
  std::vector<std::string> all_gather(const std::string& what, const std::string& mine,
                                      const std::string& hint = kCollectiveHint);
  void barrier(const std::string& what, const std::string& hint = kCollectiveHint) { all_gather(what, "", hint); }

  static constexpr size_t kChunkBytes = 4 << 20;  // bytes per store value; the server's limit is 8 MiB

  static constexpr const char* kCollectiveHint =
      "it may have crashed or hung, or it calls collectives in another order (see its output)";
  static constexpr const char* kJoinHint =
      "check that it was started, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE";

  // The leaving protocol of Communicator::shutdown(): ranks other than 0 post "left"; rank 0,
  // whose process hosts the store, waits for them unless `wait` is false (it is exiting on an
  // error and must not wait a whole timeout). Throws on timeout; callers usually swallow it.
  void leave(bool wait);

  int64_t key_count();
  int rank() const { return world_.rank; }
  int size() const { return world_.world_size; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  // Waits until `keys` (posted by `ranks`) exist; on timeout names the ranks whose keys are missing.
  void wait_for(const std::string& what, const std::vector<std::string>& keys, const std::vector<int>& ranks,
                const std::string& hint);
  [[noreturn]] void throw_store_error(const std::string& what, const std::exception& e);

  c10::intrusive_ptr<c10d::Store> store_;
  WorldInfo world_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  int64_t next_round_ = 0;
};

}  // namespace amplab::dist::detail
