// Where ranks meet (rendezvous.hpp): connecting to rank 0's TCPStore, heartbeats, StoreExchange.
#include "amplab/dist/rendezvous.hpp"

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>

#include "amplab/infra/error.hpp"
#include "amplab/infra/signals.hpp"

namespace amplab::dist::detail {

namespace {

// torch's store errors carry a C++ backtrace after the first line; users need the first line.
std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
  message = message.substr(0, message.find('\n'));
  while (!message.empty() && (message.back() == '.' || message.back() == ' ')) message.pop_back();
  return message;
}

std::string store_address(const WorldInfo& world) {
  return world.master_addr + ":" + std::to_string(world.master_port);
}

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// While a client retries connecting, torch logs every failed try as an error with a C++
// backtrace, and every wait that times out as a warning ("waitForInput ... likely a timeout"):
// our waits time out on purpose, every 250 ms, to look for dead ranks. We report the outcome in
// one line instead. Only around those calls: hiding torch's logs for longer would hide problems
// we do not report. Counted, since several threads may wait at once: the last one out restores.
class QuietTorchLogs {
 public:
  QuietTorchLogs() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (depth_++ == 0) saved_ = FLAGS_caffe2_log_level, FLAGS_caffe2_log_level = 3; /* FATAL only */
  }
  ~QuietTorchLogs() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--depth_ == 0) FLAGS_caffe2_log_level = saved_;
  }

 private:
  static inline std::mutex mutex_;
  static inline int depth_ = 0;
  static inline int saved_ = 0;
};

}  // namespace

std::chrono::milliseconds to_timeout(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

std::string format_seconds(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return out.str();
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

c10::intrusive_ptr<c10d::Store> connect_store(const WorldInfo& world, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(world.master_port);
  options.isServer = world.rank == 0 && !world.agent_store;  // torchrun's agent may host it already
  options.numWorkers = world.world_size;
  // We do our own rendezvous right after (StoreExchange::barrier), whose timeout names the
  // missing ranks; the store's built-in wait only reports a count.
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    QuietTorchLogs quiet;
    auto store = c10::make_intrusive<c10d::TCPStore>(world.master_addr, options);
    // An agent's store outlives a restart of the workers: each attempt keeps to keys of its own.
    if (!world.agent_store && world.restart_count == 0) return store;
    return c10::make_intrusive<c10d::PrefixStore>(
        "amplab/" + world.run_id + "/attempt" + std::to_string(world.restart_count) + "/", store);
  } catch (const std::exception& e) {
    if (world.rank == 0) {
      throw Error("rank 0 could not host the rendezvous store on port " + std::to_string(world.master_port) + ": " +
                  first_line(e) + "; is another job using it? pick another MASTER_PORT (amplab-run --master-port, or --standalone for a free one)");
    }
    throw Error("rank " + std::to_string(world.rank) + " could not reach the rendezvous store at " + store_address(world) +
                " (hosted by rank 0) within " + format_seconds(timeout) + ": " + first_line(e) +
                "; check that rank 0 is running and that MASTER_ADDR and MASTER_PORT point at it");
  }
}

Heartbeat::Heartbeat(const c10::intrusive_ptr<c10d::Store>& store, const WorldInfo& world)
    : writer_(store->clone()), reader_(store->clone()), rank_(world.rank) {
  const std::string key = "amplab/alive/" + std::to_string(rank_);
  writer_->set(key, to_bytes("0"));  // before anyone may look
  thread_ = std::thread([this, key] {
    int64_t beat = 0;
    while (!stop_.load()) {
      std::this_thread::sleep_for(kPeriod);
      try {
        writer_->set(key, to_bytes(std::to_string(++beat)));
      } catch (const std::exception&) {
        return;  // the store is gone (rank 0 exited): the waiters report that themselves
      }
    }
  });
}

Heartbeat::~Heartbeat() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::leave() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  try {
    writer_->set("amplab/alive/" + std::to_string(rank_), to_bytes("left"));
  } catch (const std::exception&) {
  }
}

std::vector<int> Heartbeat::silent(const std::vector<int>& ranks, std::chrono::milliseconds stale_after) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back("amplab/alive/" + std::to_string(r));
  std::vector<int> out;
  if (keys.empty() || !reader_->check(keys)) return out;  // a rank that never beat is still joining
  std::vector<std::vector<uint8_t>> values = reader_->multiGet(keys);
  const auto now = Clock::now();
  const std::vector<uint8_t> left = to_bytes("left");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (values[i] == left) continue;
    auto [it, fresh] = seen_.try_emplace(ranks[i], values[i], now);
    if (!fresh && it->second.first != values[i]) it->second = {values[i], now};
    if (now - it->second.second > stale_after) out.push_back(ranks[i]);
  }
  return out;
}

std::vector<int> Heartbeat::departed(const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back("amplab/alive/" + std::to_string(r));
  std::vector<int> out;
  if (keys.empty() || !reader_->check(keys)) return out;
  std::vector<std::vector<uint8_t>> values = reader_->multiGet(keys);
  for (size_t i = 0; i < ranks.size(); ++i)
    if (values[i] == to_bytes("left")) out.push_back(ranks[i]);
  return out;
}

std::chrono::milliseconds dead_after(std::chrono::milliseconds normal) {
  return interrupt_requested() ? std::min<std::chrono::milliseconds>(normal, std::chrono::seconds(2)) : normal;
}

StoreExchange::StoreExchange(c10::intrusive_ptr<c10d::Store> store, const WorldInfo& world,
                             std::chrono::milliseconds timeout, std::string prefix, Heartbeat* heartbeat,
                             std::chrono::milliseconds dead_after)
    : store_(std::move(store)),
      world_(world),
      timeout_(timeout),
      prefix_(std::move(prefix)),
      heartbeat_(heartbeat),
      dead_after_(dead_after) {}

void StoreExchange::throw_store_error(const std::string& what, const std::exception& e) {
  if (dynamic_cast<const c10::DistNetworkError*>(&e) != nullptr && world_.rank != 0) {
    throw Error(what + ": rank " + std::to_string(world_.rank) + " lost the connection to the rendezvous store at " +
                store_address(world_) + ": rank 0, which hosts it, has probably exited (see its output): " +
                first_line(e));
  }
  throw Error(what + ": rendezvous store error on rank " + std::to_string(world_.rank) + ": " + first_line(e));
}

std::vector<int> StoreExchange::departed_without_posting(const std::vector<std::string>& keys,
                                                         const std::vector<int>& ranks, const std::vector<int>& missing) {
  std::vector<int> out;
  for (int r : heartbeat_->departed(missing)) {
    // Looked at again: the key may have come between the first look and the departure.
    const auto at = std::find(ranks.begin(), ranks.end(), r) - ranks.begin();
    if (!store_->check({keys[at]})) out.push_back(r);
  }
  return out;
}

void StoreExchange::wait_for(const std::string& what, const std::vector<std::string>& keys,
                             const std::vector<int>& ranks, const std::string& hint, bool posted_before_leaving) {
  if (keys.empty()) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout_;
  // In slices: between them, look for a rank that died (its heartbeat stopped).
  const auto slice = heartbeat_ ? std::chrono::milliseconds(250) : timeout_;
  while (true) {
    std::vector<int> missing;
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      QuietTorchLogs quiet;
      store_->wait(keys, std::max(std::chrono::milliseconds(1), std::min(slice, left)));
      return;
    } catch (const c10::DistNetworkError& e) {
      throw_store_error(what, e);
    } catch (const c10::Error& e) {
      // A timeout (of the slice or of the whole wait): who is missing?
      try {
        for (size_t i = 0; i < keys.size(); ++i)
          if (!store_->check({keys[i]})) missing.push_back(ranks[i]);
      } catch (const std::exception& e2) {
        throw_store_error(what, e2);
      }
      if (missing.empty()) {
        if (Clock::now() < deadline) continue;
        throw_store_error(what, e);
      }
    }
    if (heartbeat_) {
      std::vector<int> dead, gone;
      try {
        dead = heartbeat_->silent(missing, dead_after(dead_after_));
        if (posted_before_leaving) gone = departed_without_posting(keys, ranks, missing);
      } catch (const std::exception& e) {
        throw_store_error(what, e);
      }
      if (!gone.empty())
        throw PeerLost(what + ": " + format_ranks(gone) + " left the process group without taking part (it ended or " +
                       "stopped before this collective; see its output): rank " + std::to_string(world_.rank) +
                       " stops too");
      if (!dead.empty())
        throw PeerLost(what + ": " + format_ranks(dead) + " stopped responding (no sign of life for " +
                       format_seconds(dead_after(dead_after_)) + "; it probably died, see its output): rank " +
                       std::to_string(world_.rank) + " stops too" +
                       (interrupt_requested() ? " (it was asked to stop by a signal)" : ""));
    }
    if (Clock::now() >= deadline)
      throw Error(what + ": rank " + std::to_string(world_.rank) + " timed out after " + format_seconds(timeout_) +
                  " waiting for " + format_ranks(missing) + " (of " + std::to_string(world_.world_size) + "); " + hint);
  }
}

std::vector<std::string> StoreExchange::round(const std::string& what, bool post, const std::string& mine,
                                              const std::vector<int>& from, const std::string& hint) {
  const std::string round_prefix = prefix_ + std::to_string(next_round_++) + "/";
  auto key_of = [&](int rank) { return round_prefix + std::to_string(rank); };
  auto chunk_key = [&](int rank, size_t i) { return key_of(rank) + "/" + std::to_string(i); };

  std::vector<std::string> out(from.size());
  std::vector<uint32_t> extra_chunks(from.size(), 0);  // per rank in `from`, for the clean-up
  try {
    if (post) {
      // The extra chunks first, then the main key: once a reader sees the main key, all is there.
      uint32_t extra = mine.size() <= kChunkBytes ? 0 : static_cast<uint32_t>((mine.size() - 1) / kChunkBytes);
      for (uint32_t i = 1; i <= extra; ++i)
        store_->set(chunk_key(world_.rank, i), to_bytes(mine.substr(i * kChunkBytes, kChunkBytes)));
      std::string head(reinterpret_cast<const char*>(&extra), sizeof extra);
      store_->set(key_of(world_.rank), to_bytes(head + mine.substr(0, kChunkBytes)));
      for (size_t i = 0; i < from.size(); ++i)
        if (from[i] == world_.rank) extra_chunks[i] = extra;
    }

    std::vector<std::string> keys;
    std::vector<int> ranks;
    std::vector<size_t> slots;  // index into `from` of each key
    for (size_t i = 0; i < from.size(); ++i) {
      if (from[i] == world_.rank && post) {
        out[i] = mine;  // our own bytes
        continue;
      }
      keys.push_back(key_of(from[i]));
      ranks.push_back(from[i]);
      slots.push_back(i);
    }
    wait_for(what, keys, ranks, hint);
    std::vector<std::vector<uint8_t>> heads = keys.empty() ? std::vector<std::vector<uint8_t>>{} : store_->multiGet(keys);
    for (size_t k = 0; k < keys.size(); ++k) {
      const auto& head = heads[k];
      uint32_t extra = 0;
      if (head.size() < sizeof extra) throw Error(what + ": malformed message from rank " + std::to_string(ranks[k]));
      std::memcpy(&extra, head.data(), sizeof extra);
      std::string& bytes = out[slots[k]];
      bytes.assign(head.begin() + sizeof extra, head.end());
      extra_chunks[slots[k]] = extra;
      if (extra == 0) continue;
      std::vector<std::string> rest;
      for (uint32_t i = 1; i <= extra; ++i) rest.push_back(chunk_key(ranks[k], i));
      for (const auto& chunk : store_->multiGet(rest)) bytes.append(chunk.begin(), chunk.end());
    }

    // Everyone counts themselves done; the last one deletes the round's keys. In our rounds the
    // ranks read from are the ranks that posted (all_gather: all; broadcast: the root).
    if (store_->add(round_prefix + "done", 1) == world_.world_size) {
      for (size_t i = 0; i < from.size(); ++i) {
        store_->deleteKey(key_of(from[i]));
        for (uint32_t c = 1; c <= extra_chunks[i]; ++c) store_->deleteKey(chunk_key(from[i], c));
      }
      store_->deleteKey(round_prefix + "done");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw_store_error(what, e);
  }
  return out;
}

std::vector<std::string> StoreExchange::all_gather(const std::string& what, const std::string& mine,
                                                   const std::string& hint) {
  std::vector<int> everyone(world_.world_size);
  for (int r = 0; r < world_.world_size; ++r) everyone[r] = r;
  return round(what, true, mine, everyone, hint);
}

void StoreExchange::leave(bool wait) {
  const std::string leave_prefix = prefix_ + "left/";
  if (world_.rank != 0) {
    store_->set(leave_prefix + std::to_string(world_.rank), std::vector<uint8_t>{});
    return;
  }
  if (!wait) return;
  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int r = 1; r < world_.world_size; ++r) {
    keys.push_back(leave_prefix + std::to_string(r));
    ranks.push_back(r);
  }
  wait_for("leaving the process group", keys, ranks, kCollectiveHint, /*posted_before_leaving=*/false);
}

int64_t StoreExchange::key_count() { return store_->getNumKeys(); }

}  // namespace amplab::dist::detail
