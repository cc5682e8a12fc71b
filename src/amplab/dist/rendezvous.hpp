// Internal to the dist backends: where ranks meet (rank 0's c10d::TCPStore) and a numbered
// "post my bytes, read the others'" exchange over it, with timeouts that name missing ranks.
// The cpu backend builds every collective on StoreExchange; nccl uses it for metadata only.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amplab/dist/world.hpp"

namespace amplab::dist::detail {

std::chrono::milliseconds to_timeout(double seconds);
std::string format_seconds(std::chrono::milliseconds timeout);  // "2 s", "0.5 s"
std::string format_ranks(const std::vector<int>& ranks);        // "rank 2", "ranks 1, 3"

// Rank 0 hosts a TCPStore at world.master_port; the others connect to master_addr (retrying
// until `timeout`). Errors say who could not host or reach the store, and what to check.
c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world, std::chrono::milliseconds timeout);

// Signs of life. Every rank bumps a counter in the store (amplab/alive/<rank>) every half second
// from a thread and a store connection of its own; silent() names the ranks whose counter has
// stopped, so that a rank waiting for a dead peer stops, naming it, instead of hanging until the
// timeout (or until a launcher kills it with nothing said).
class Heartbeat {
 public:
  Heartbeat(const c10::intrusive_ptr<c10d::Store>& store, const WorldInfo& world);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  // Ranks among `ranks` whose counter has not moved for `stale_after`, by this process's clock
  // since it first looked at them (so no clocks need to agree). Thread-safe.
  // Ranks that left cleanly (leave()) are never silent.
  std::vector<int> silent(const std::vector<int>& ranks, std::chrono::milliseconds stale_after);
  // Ranks among `ranks` that left on purpose (leave()). Thread-safe.
  std::vector<int> departed(const std::vector<int>& ranks);
  // Stops beating and tells the others this rank is leaving on purpose. Idempotent.
  void leave();
  static constexpr std::chrono::milliseconds kPeriod{500};

 private:
  using Clock = std::chrono::steady_clock;
  c10::intrusive_ptr<c10d::Store> writer_, reader_;  // two connections of their own
  int rank_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mutex_;  // reader_ and seen_
  std::map<int, std::pair<std::vector<uint8_t>, Clock::time_point>> seen_;  // rank -> last value, when it changed
};

// How long to wait for a silent rank before calling it dead: `normal`, or 2 s once this process
// has been asked to stop (SIGINT/SIGTERM: a launcher stopping the job after a rank died).
std::chrono::milliseconds dead_after(std::chrono::milliseconds normal);

// Rounds of byte exchange. Round n uses keys <prefix><n>/<rank>; the last rank to finish reading
// a round deletes its keys, so a long run does not grow the store. TCPStore's (libuv) server
// refuses messages over 8 MiB, so larger posts travel in chunks of kChunkBytes. Not
// thread-safe: one thread drives it (the cpu backend's worker, or the caller for nccl).
class StoreExchange {
 public:
  // With a `heartbeat`, waits give up early on a rank that stopped beating for `dead_after`
  // (dead_after()), with an amplab::PeerLost naming it.
  StoreExchange(c10::intrusive_ptr<c10d::Store> store, const WorldInfo& world, std::chrono::milliseconds timeout,
                std::string prefix, Heartbeat* heartbeat = nullptr,
                std::chrono::milliseconds dead_after = std::chrono::seconds(15));

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
  // With `posted_before_leaving`, a rank that left (Heartbeat::departed) without posting its key
  // never will (a rank leaves after its last collective): the wait fails at once, naming it.
  void wait_for(const std::string& what, const std::vector<std::string>& keys, const std::vector<int>& ranks,
                const std::string& hint, bool posted_before_leaving = true);
  // The ranks among `missing` (whose `keys` were absent) that left and still have not posted.
  std::vector<int> departed_without_posting(const std::vector<std::string>& keys, const std::vector<int>& ranks,
                                            const std::vector<int>& missing);
  [[noreturn]] void throw_store_error(const std::string& what, const std::exception& e);

  c10::intrusive_ptr<c10d::Store> store_;
  WorldInfo world_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  Heartbeat* heartbeat_;
  std::chrono::milliseconds dead_after_;
  int64_t next_round_ = 0;
};

}  // namespace amplab::dist::detail
