#include "support/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/harness.hpp"

extern char** environ;

namespace retryloop::test {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, std::vector<std::string> env) {
  static int counter = 0;
  const std::string stem =
      (std::filesystem::temp_directory_path() /
       ("retryloop-child-" + std::to_string(getpid()) + "-" + std::to_string(++counter)))
          .string();
  out_path_ = stem + ".out";
  err_path_ = stem + ".err";

  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    bool replaced = false;
    for (const auto& change : env) {
      const std::string name = change.substr(0, change.find('=') + 1);
      if (entry.rfind(name, 0) == 0) replaced = true;
    }
    if (!replaced) environment.push_back(entry);
  }
  for (const auto& change : env) {
    if (change.back() != '=') environment.push_back(change);
  }
  std::vector<char*> envp;
  for (auto& entry : environment)
    envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& arg : argv)
    args.push_back(arg.data());
  args.push_back(nullptr);

  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int in = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || in < 0) _exit(127);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (running()) {
    ::kill(pid_, SIGKILL);
    wait(5000);
  }
  std::remove(out_path_.c_str());
  std::remove(err_path_.c_str());
}

void ChildProcess::signal(int signum) {
  if (running()) ::kill(pid_, signum);
}

bool ChildProcess::running() {
  if (exited_) return false;
  pid_t done = waitpid(pid_, &status_, WNOHANG);
  if (done == pid_) exited_ = true;
  return !exited_;
}

int ChildProcess::wait(int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (running()) {
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

std::string ChildProcess::out() const {
  return slurp(out_path_);
}
std::string ChildProcess::err() const {
  return slurp(err_path_);
}

std::string built_program(const std::string& relative) {
  return (std::filesystem::path(RETRYLOOP_BINARY_DIR) / relative).string();
}

CommandRun run_retryloop(const std::vector<std::string>& args, int timeout_ms,
                         const std::vector<std::string>& env, const std::string& input) {
  std::vector<std::string> argv{built_program("retryloop")};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string stdin_file;
  if (!input.empty()) {
    stdin_file =
        (std::filesystem::temp_directory_path() / (unique_name("stdin") + ".txt")).string();
    std::ofstream(stdin_file) << input;
    argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" < " + stdin_file});
  }
  std::vector<std::string> environment{"RETRYLOOP_URL=" + broker_url(), "RETRYLOOP_TOPOLOGY="};
  environment.insert(environment.end(), env.begin(), env.end());
  ChildProcess child(argv, environment);
  CommandRun run;
  run.exit_code = child.wait(timeout_ms);
  run.out = child.out();
  run.err = child.err();
  if (!stdin_file.empty()) std::filesystem::remove(stdin_file);
  return run;
}

int console_port(ChildProcess& console) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const std::string marker = "open  http://127.0.0.1:";
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string out = console.out();
    const size_t at = out.find(marker);
    if (at != std::string::npos) return std::stoi(out.substr(at + marker.size()));
    if (!console.running()) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

}  // namespace retryloop::test
