// Spawning and reaping the ranks of one job (host only).
#include "comm/launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/strings.h"
#include "comm/bootstrap.h"

extern char** environ;

namespace dsinfer::comm {
namespace {

constexpr const char* kVisible = "CUDA_VISIBLE_DEVICES";

bool is_var(const char* entry, const char* name) {
  const size_t n = std::strlen(name);
  return std::strncmp(entry, name, n) == 0 && entry[n] == '=';
}

// The device each rank sees: the parent's CUDA_VISIBLE_DEVICES entries, or 0..n-1.
Result<std::vector<std::string>> rank_devices(int n) {
  std::vector<std::string> devs;
  const char* v = std::getenv(kVisible);
  if (v == nullptr) {
    for (int r = 0; r < n; ++r) devs.push_back(std::to_string(r));
    return devs;
  }
  for (std::string d : str_split(v, ',')) {
    d.erase(0, d.find_first_not_of(" \t"));
    d.erase(d.find_last_not_of(" \t") + 1);
    if (!d.empty())
      devs.push_back(d);
  }
  if (static_cast<int>(devs.size()) < n)
    return invalid_argument(
        str_format("%d ranks need %d GPUs but %s='%s' lists %zu", n, n, kVisible, v, devs.size()));
  devs.resize(static_cast<size_t>(n));
  return devs;
}

std::string describe_exit(int rank, pid_t pid, int status) {
  if (WIFEXITED(status))
    return str_format("rank %d (pid %d) exited with status %d", rank, pid, WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return str_format(
        "rank %d (pid %d) was killed by signal %d (%s)", rank, pid, sig, strsignal(sig));
  }
  return str_format("rank %d (pid %d) ended with wait status 0x%x", rank, pid, status);
}

// Blocking reap, retrying on EINTR.
void reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

Result<std::vector<pid_t>> spawn_ranks(int n,
                                       const std::vector<std::string>& argv,
                                       const std::string& id_file) {
  if (n < 1 || n > kMaxRanks)
    return invalid_argument(str_format("spawn_ranks: %d ranks (expected 1..%d)", n, kMaxRanks));
  if (argv.empty() || argv[0].empty())
    return invalid_argument("spawn_ranks: empty command line");
  if (id_file.empty())
    return invalid_argument("spawn_ranks: empty id file path");
  DSI_ASSIGN_OR_RETURN(const std::vector<std::string> devs, rank_devices(n));
  if (::unlink(id_file.c_str()) != 0 && errno != ENOENT)
    return io_error(id_file + ": cannot remove the stale id file: " + std::strerror(errno));

  // Everything the children get is built before the first spawn.
  std::vector<std::string> base_env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (is_var(*e, kEnvRank) || is_var(*e, kEnvSize) || is_var(*e, kEnvIdFile) ||
        is_var(*e, kVisible))
      continue;
    base_env.emplace_back(*e);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env = base_env;
    env.push_back(str_format("%s=%d", kEnvRank, r));
    env.push_back(str_format("%s=%d", kEnvSize, n));
    env.push_back(std::string(kEnvIdFile) + "=" + id_file);
    env.push_back(std::string(kVisible) + "=" + devs[static_cast<size_t>(r)]);
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int err = ::posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), envp.data());
    if (err != 0) {
      for (const pid_t p : pids) ::kill(p, SIGKILL);
      for (const pid_t p : pids) reap(p);
      return io_error(str_format(
          "cannot start rank %d of %d: %s: %s", r, n, argv[0].c_str(), std::strerror(err)));
    }
    pids.push_back(pid);
  }
  return pids;
}

Status wait_ranks(const std::vector<pid_t>& pids, int grace_ms) {
  for (size_t r = 0; r < pids.size(); ++r) {
    if (pids[r] <= 0)
      return invalid_argument(str_format("wait_ranks: rank %zu has pid %d", r, pids[r]));
  }
  std::vector<bool> running(pids.size(), true);
  size_t left = pids.size();
  Status failure;
  auto pause = std::chrono::milliseconds(1);
  // Reaps whatever ended; records the first failure.
  auto poll = [&]() {
    bool any = false;
    for (size_t r = 0; r < pids.size(); ++r) {
      if (!running[r])
        continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR))
        continue;
      running[r] = false;
      --left;
      any = true;
      if (!failure.ok())
        continue;
      if (got < 0) {
        failure =
            Status(StatusCode::kInternal,
                   str_format("rank %zu (pid %d): waitpid: %s", r, pids[r], std::strerror(errno)));
      } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        failure =
            Status(StatusCode::kInternal, describe_exit(static_cast<int>(r), pids[r], status));
      }
    }
    return any;
  };
  auto sleep = [&](bool progressed) {
    if (progressed)
      pause = std::chrono::milliseconds(1);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  };

  while (left > 0 && failure.ok()) sleep(poll());
  if (failure.ok())
    return Status();

  // One rank failed: stop the others (SIGTERM, then SIGKILL after the grace period).
  const size_t stopped = left;
  for (size_t r = 0; r < pids.size(); ++r) {
    if (running[r])
      ::kill(pids[r], SIGTERM);
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(0, grace_ms));
  while (left > 0 && std::chrono::steady_clock::now() < deadline) sleep(poll());
  for (size_t r = 0; r < pids.size(); ++r) {
    if (running[r]) {
      ::kill(pids[r], SIGKILL);
      reap(pids[r]);
      running[r] = false;
    }
  }
  if (stopped == 0)
    return failure;
  return Status(
      failure.code(),
      failure.message() +
          str_format("; stopped the %zu other running rank%s", stopped, stopped == 1 ? "" : "s"));
}

}  // namespace dsinfer::comm
