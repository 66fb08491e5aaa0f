// The retryloop command. Each command group (topology, parking, outbox) adds its subcommands;
// this file only parses the command line and turns failures into exit codes.

#include <CLI/CLI.hpp>

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>

#include "command_line.hpp"
#include "common.hpp"

namespace {

/// True when `fd` is a pipe whose reading end is closed (`retryloop ... | head` after head quit).
bool is_closed_pipe(int fd) {
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISFIFO(info.st_mode)) return false;
  pollfd poll_fd{fd, POLLOUT, 0};
  return poll(&poll_fd, 1, 0) == 1 && (poll_fd.revents & POLLERR) != 0;
}

/// Flushes standard output: a failed write must not pass for success. SIGPIPE is ignored, so a
/// closed pipe is a failed write too; that one is expected (`| head`) and gets no message.
int checked_output(int exit_code) {
  std::cout.flush();
  if (std::cout) return exit_code;
  const int error = errno;
  if (!is_closed_pipe(STDOUT_FILENO)) {
    std::cerr << "retryloop: cannot write to standard output: " << std::strerror(error) << "\n";
  }
  return exit_code == retryloop::cli::exit_ok ? retryloop::cli::exit_output : exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace retryloop::cli;
  std::signal(SIGPIPE, SIG_IGN);  // a closed stdout is reported by checked_output instead
  CLI::App app;
  int exit_code = exit_ok;
  build_command_line(app, exit_code);

  if (argc < 2) {
    std::cout << app.help();
    return checked_output(exit_usage);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int printed = app.exit(e);
    return checked_output(printed == 0 ? exit_ok : exit_usage);
  } catch (const Failure& f) {
    std::cerr << "retryloop: " << f.what() << "\n";
    return checked_output(f.code());
  } catch (const std::exception& e) {
    std::cerr << "retryloop: " << e.what() << "\n";
    return checked_output(exit_usage);
  }
  return checked_output(exit_code);
}
