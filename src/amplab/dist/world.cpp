// WorldInfo from torchrun's environment variables (world.hpp), each checked and named in errors.
#include "amplab/dist/world.hpp"

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>

#include "amplab/infra/error.hpp"

namespace amplab::dist {

namespace {

constexpr const char* kHowToLaunch = "start workers with amplab-run or torchrun";

// An integer in [lo, hi] from variable `name`, or nullopt when it is not set.
std::optional<int> read_int(const EnvLookup& lookup, const char* name, long lo, long hi, const std::string& range_note) {
  const char* text = lookup(name);
  if (text == nullptr) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  bool ok = *text != '\0' && end != nullptr && *end == '\0' && errno == 0 && value >= lo && value <= hi;
  if (!ok) {
    throw Error(std::string("environment variable ") + name + "='" + text + "' is not valid: expected an integer in [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]" + range_note + "; " + kHowToLaunch);
  }
  return static_cast<int>(value);
}

int require_int(const EnvLookup& lookup, const char* name, long lo, long hi, const std::string& range_note) {
  auto value = read_int(lookup, name, lo, hi, range_note);
  if (!value) {
    throw Error(std::string("environment variable ") + name + " is not set but WORLD_SIZE is: expected an integer in [" +
                std::to_string(lo) + ", " + std::to_string(hi) + "]" + range_note + "; " + kHowToLaunch);
  }
  return *value;
}

}  // namespace

std::string WorldInfo::describe() const {
  if (!is_distributed()) return "single process";
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " + std::to_string(local_rank) +
         " of " + std::to_string(local_world_size) + ", node " + std::to_string(group_rank) + "), store " + master_addr +
         ":" + std::to_string(master_port);
}

WorldInfo world_from_env() {
  return world_from_env([](const char* name) -> const char* { return std::getenv(name); });
}

WorldInfo world_from_env(const EnvLookup& lookup) {
  WorldInfo world;
  constexpr long kMaxInt = std::numeric_limits<int>::max();
  auto world_size = read_int(lookup, "WORLD_SIZE", 1, kMaxInt, "");
  if (!world_size) {
    // A lone RANK without WORLD_SIZE is a half-configured launch, not a single process.
    if (lookup("RANK") != nullptr)
      throw Error(std::string("environment variable RANK is set but WORLD_SIZE is not: set both (WORLD_SIZE >= 1); ") +
                  kHowToLaunch);
    return world;
  }
  world.world_size = *world_size;
  std::string ws = " (WORLD_SIZE=" + std::to_string(world.world_size) + ")";
  world.rank = require_int(lookup, "RANK", 0, world.world_size - 1, ws);
  world.local_world_size = require_int(lookup, "LOCAL_WORLD_SIZE", 1, world.world_size, ws);
  std::string lws = " (LOCAL_WORLD_SIZE=" + std::to_string(world.local_world_size) + ")";
  world.local_rank = require_int(lookup, "LOCAL_RANK", 0, world.local_world_size - 1, lws);
  int nodes = (world.world_size + world.local_world_size - 1) / world.local_world_size;
  world.group_rank = read_int(lookup, "GROUP_RANK", 0, nodes - 1, " (WORLD_SIZE / LOCAL_WORLD_SIZE nodes)")
                         .value_or(world.rank / world.local_world_size);
  if (const char* addr = lookup("MASTER_ADDR")) {
    if (*addr == '\0') throw Error(std::string("environment variable MASTER_ADDR is empty: expected a host name or IP address; ") + kHowToLaunch);
    world.master_addr = addr;
  }
  world.master_port = read_int(lookup, "MASTER_PORT", 1, 65535, "").value_or(world.master_port);
  if (const char* agent = lookup("TORCHELASTIC_USE_AGENT_STORE")) world.agent_store = std::string(agent) == "True";
  world.restart_count = read_int(lookup, "TORCHELASTIC_RESTART_COUNT", 0, kMaxInt, "").value_or(0);
  if (const char* id = lookup("TORCHELASTIC_RUN_ID")) world.run_id = id;
  return world;
}

}  // namespace amplab::dist
