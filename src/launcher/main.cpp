// amplab-run: starts the workers of a distributed run on this node, torchrun-style.
//
//   amplab-run --nproc-per-node 2 -- build/bin/ddp --config configs/ddp.yaml
//   amplab-run --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 --nproc-per-node 8 -- ...
//
// Each worker gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on top of the launcher's own, so
// NCCL_*, CUDA_VISIBLE_DEVICES and friends pass through. Like torchrun, --max-restarts N starts
// every worker again when one fails (up to N times; TORCHELASTIC_RESTART_COUNT tells them which
// attempt this is, and `--resume auto` makes them go on from the latest checkpoint). What it
// does not do, unlike torchrun: elastic membership, restarts across nodes, a rendezvous between
// nodes (each node is started by hand with the same --nnodes/--master-addr/--master-port and
// its own --node-rank).
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include "supervisor.hpp"

extern char** environ;

namespace {

constexpr int kExitUsage = 2;

// The variables the launcher sets; any the launcher itself inherited are replaced.
const std::set<std::string> kWorkerVariables = {"RANK",       "LOCAL_RANK",       "WORLD_SIZE",  "LOCAL_WORLD_SIZE",
                                                "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",   "ROLE_WORLD_SIZE",
                                                "MASTER_ADDR", "MASTER_PORT"};

// A TCP port nobody listens on now: bind port 0, read what the kernel chose, close. Another
// program could take it before rank 0 binds it; unlikely, and rank 0 then says so.
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    port = ntohs(address.sin_port);
  close(fd);
  return port;
}

// The launcher's environment minus what it sets (and torchrun's elastic agent's variables,
// which would make a worker think an elastic agent supervises it).
std::vector<std::string> inherited_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    if (kWorkerVariables.count(name) || name.rfind("TORCHELASTIC_", 0) == 0) continue;
    env.push_back(entry);
  }
  return env;
}

bool has_variable(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& entry : env)
    if (entry.rfind(name + "=", 0) == 0) return true;
  return false;
}

int usage_error(const std::string& message) {
  std::cerr << "amplab-run: " << message << " (see amplab-run --help)\n";
  return kExitUsage;
}

// What the command line asks for.
struct Launch {
  int nproc_per_node = 1, nnodes = 1, node_rank = 0, master_port = 0;
  std::string master_addr;
  bool standalone = false;
  double grace_s = 5;
  int max_restarts = 0;
  bool addr_given = false, port_given = false;
  std::vector<std::string> command;  // the worker's command line
};

// First of all: `amplab-run ... | head -1` must not die of its first line (and take its workers
// with it). Workers get SIGPIPE back (supervisor.cpp) and decide for themselves. A closed
// stdin/stdout/stderr (started with 2>&-) is reopened on /dev/null, so that the pipes to the
// workers never take its number and receive the launcher's own lines.
void survive_closed_outputs() {
  signal(SIGPIPE, SIG_IGN);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int null = open("/dev/null", O_RDWR);
    if (null >= 0 && null != fd) dup2(null, fd), close(null);
  }
}

// Fills `launch` from the command line. An exit code when there is nothing to run: 0 after
// --help, kExitUsage after a parse error (said on stderr).
std::optional<int> parse_command_line(int argc, char** argv, Launch& launch) {
  CLI::App app(
      "Starts N worker processes on this node with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, "
      "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), prefixes their output with [rank N], forwards "
      "SIGINT/SIGTERM, and stops them all when one fails.\n\n"
      "  amplab-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] "
      "[--standalone] -- BINARY [ARGS...]",
      "amplab-run");
  app.add_option("--nproc-per-node,--nproc_per_node", launch.nproc_per_node, "workers on this node (one per GPU)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--nnodes", launch.nnodes, "nodes in the job (start amplab-run on each)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", launch.node_rank, "this node's index, in [0, nnodes)")->capture_default_str();
  app.add_option("--master-addr,--master_addr", launch.master_addr,
                 "host of node 0, where rank 0 hosts the rendezvous store (default 127.0.0.1)");
  app.add_option("--master-port,--master_port", launch.master_port,
                 "the store's TCP port (default: a free port on one node, 29500 on several)")
      ->check(CLI::Range(1, 65535));
  app.add_flag("--standalone", launch.standalone, "one node, local store on a free port");
  app.add_option("--grace-period", launch.grace_s, "seconds between SIGTERM and SIGKILL when stopping workers")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", launch.max_restarts,
                 "when a worker fails, stop the others and start them all again, up to this many times (one node)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  // Everything from the first positional argument (or after "--") is the worker's command line.
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  launch.command = app.remaining();
  if (!launch.command.empty() && launch.command.front() == "--") launch.command.erase(launch.command.begin());
  launch.addr_given = app.count("--master-addr") > 0;
  launch.port_given = app.count("--master-port") > 0;
  return std::nullopt;
}

// The usage errors, each a line on stderr and kExitUsage; then the store's address and port
// where they were not given.
std::optional<int> check_and_complete(Launch& launch) {
  const std::vector<std::string>& command = launch.command;
  const int nnodes = launch.nnodes, node_rank = launch.node_rank;
  if (command.empty()) return usage_error("no worker command: put it after --, e.g. amplab-run --nproc-per-node 2 -- build/bin/ddp");
  if (!command.front().empty() && command.front()[0] == '-' && command.front() != "-")
    return usage_error("unknown option '" + command.front() + "' before the worker command");
  if (node_rank < 0 || node_rank >= nnodes)
    return usage_error("--node-rank " + std::to_string(node_rank) + " is not in [0, " + std::to_string(nnodes) + ") (--nnodes " +
                       std::to_string(nnodes) + ")");
  if (launch.standalone && nnodes > 1) return usage_error("--standalone runs one node; drop it or --nnodes");
  if (launch.standalone && (launch.addr_given || launch.port_given))
    return usage_error("--standalone picks the store's address and port itself; drop --master-addr/--master-port");
  if (nnodes > 1 && !launch.addr_given)
    return usage_error("--nnodes " + std::to_string(nnodes) + " needs --master-addr: the host of node 0, reachable from every node");

  if (launch.max_restarts > 0 && nnodes > 1)
    return usage_error("--max-restarts restarts the workers of one node; a job of several nodes needs torchrun's elastic "
                       "agent (torchrun --nnodes ... --max-restarts ...)");

  if (!launch.addr_given) launch.master_addr = "127.0.0.1";
  if (!launch.port_given) launch.master_port = nnodes > 1 ? 29500 : free_port();
  if (launch.master_port == 0) return usage_error("could not find a free TCP port; pass --master-port");
  return std::nullopt;
}

// This node's workers, each with the launcher's environment plus torchrun's variables.
amplab::launcher::SupervisorOptions plan_workers(const Launch& launch) {
  std::vector<std::string> base = inherited_environment();
  // As torchrun does: several workers each running as many threads as there are cores would
  // fight over them.
  if (launch.nproc_per_node > 1 && !has_variable(base, "OMP_NUM_THREADS")) {
    base.push_back("OMP_NUM_THREADS=1");
    std::cerr << "amplab-run: OMP_NUM_THREADS is not set: using 1 CPU thread per worker (set it to choose)\n";
  }

  amplab::launcher::SupervisorOptions options;
  options.command = launch.command;
  options.grace_s = launch.grace_s;
  const int world_size = launch.nnodes * launch.nproc_per_node;
  for (int local = 0; local < launch.nproc_per_node; ++local) {
    amplab::launcher::Worker worker;
    worker.rank = launch.node_rank * launch.nproc_per_node + local;
    worker.local_rank = local;
    worker.env = base;
    auto set = [&](const std::string& name, const std::string& value) { worker.env.push_back(name + "=" + value); };
    set("RANK", std::to_string(worker.rank));
    set("LOCAL_RANK", std::to_string(local));
    set("WORLD_SIZE", std::to_string(world_size));
    set("LOCAL_WORLD_SIZE", std::to_string(launch.nproc_per_node));
    set("GROUP_RANK", std::to_string(launch.node_rank));
    set("GROUP_WORLD_SIZE", std::to_string(launch.nnodes));
    set("ROLE_RANK", std::to_string(worker.rank));
    set("ROLE_WORLD_SIZE", std::to_string(world_size));
    set("MASTER_ADDR", launch.master_addr);
    set("MASTER_PORT", std::to_string(launch.master_port));
    options.workers.push_back(std::move(worker));
  }
  return options;
}

// Runs the workers until they succeed, a signal stops them, they cannot start, or the restarts
// are used up; returns the last run's exit code.
int run_with_restarts(const Launch& launch, amplab::launcher::SupervisorOptions options) {
  const int nproc_per_node = launch.nproc_per_node, node_rank = launch.node_rank, max_restarts = launch.max_restarts;
  const int world_size = launch.nnodes * nproc_per_node;
  int master_port = launch.master_port;
  for (int attempt = 0;; ++attempt) {
    amplab::launcher::SupervisorOptions run = options;
    for (auto& worker : run.workers) {
      worker.env.push_back("TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt));
      worker.env.push_back("TORCHELASTIC_MAX_RESTARTS=" + std::to_string(max_restarts));
    }
    std::cerr << "amplab-run: starting ranks " << node_rank * nproc_per_node << "-" << (node_rank + 1) * nproc_per_node - 1
              << " of " << world_size << ", store " << launch.master_addr << ":" << master_port
              << (attempt > 0 ? " (restart " + std::to_string(attempt) + " of " + std::to_string(max_restarts) + ")" : "")
              << "\n";
    bool interrupted = false;
    int code = amplab::launcher::supervise(run, &interrupted);
    if (code == 0 || interrupted || code == 127 || attempt >= max_restarts) {
      if (code != 0 && !interrupted && max_restarts > 0 && attempt >= max_restarts)
        std::cerr << "amplab-run: giving up after " << max_restarts << " restart(s)\n";
      return code;
    }
    // A fresh port: the dead store's may linger in TIME_WAIT.
    if (!launch.port_given) {
      master_port = free_port();
      for (auto& worker : options.workers)
        for (auto& entry : worker.env)
          if (entry.rfind("MASTER_PORT=", 0) == 0) entry = "MASTER_PORT=" + std::to_string(master_port);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  survive_closed_outputs();
  Launch launch;
  if (auto code = parse_command_line(argc, argv, launch)) return *code;
  if (auto code = check_and_complete(launch)) return *code;
  return run_with_restarts(launch, plan_workers(launch));
}
