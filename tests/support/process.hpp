#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace retryloop::test {

/// A program run by a test, with its stdout and stderr in files. The destructor kills it
/// (SIGKILL) if it still runs, and removes the files.
class ChildProcess {
 public:
  /// Starts `argv` (argv[0] is the path) with the test's environment plus `env` (NAME=value
  /// entries; a NAME= entry with no value removes the variable).
  ChildProcess(std::vector<std::string> argv, std::vector<std::string> env = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// Sends a signal (no effect once it has exited).
  void signal(int signum);
  /// Waits for it to end, up to `timeout_ms`; returns the exit code, 128 + signal when a signal
  /// ended it, or -1 when it still runs at the timeout.
  int wait(int timeout_ms = 30000);
  bool running();
  std::string out() const;
  std::string err() const;

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  bool exited_ = false;
  std::string out_path_;
  std::string err_path_;
};

/// The port a `retryloop parking serve` prints in its `open` line, once it does (waiting up to 30
/// s); 0 when it exited first or never printed it.
int console_port(ChildProcess& console);

/// Path of a program the build made, relative to the build tree (`examples/demo_consumer`).
std::string built_program(const std::string& relative);

/// What a run of the retryloop command printed, and its exit code.
struct CommandRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};
/// Runs the retryloop command the build made with `args` against the test broker (RETRYLOOP_URL
/// set, RETRYLOOP_TOPOLOGY unset, then the `env` entries as ChildProcess takes them), waiting up
/// to `timeout_ms` for it to end. Its standard input is `input` when not empty, else /dev/null.
CommandRun run_retryloop(const std::vector<std::string>& args, int timeout_ms = 60000,
                         const std::vector<std::string>& env = {}, const std::string& input = {});

}  // namespace retryloop::test
