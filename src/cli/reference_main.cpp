// retryloop_reference OUT_DIR: writes the man pages (OUT_DIR/man/*.1) and the bash completion
// (OUT_DIR/bash-completion/retryloop) from the command line's definition. Run by the build; the
// pages are dated by SOURCE_DATE_EPOCH when it is set (reproducible builds), else today.

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "command_line.hpp"
#include "reference.hpp"

namespace {

std::string build_date() {
  std::time_t now = std::time(nullptr);
  if (const char* epoch = std::getenv("SOURCE_DATE_EPOCH")) now = std::strtoll(epoch, nullptr, 10);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

bool write_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (out) return true;
  std::cerr << "retryloop_reference: cannot write " << path.string() << "\n";
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: retryloop_reference OUT_DIR\n";
    return 1;
  }
  const std::filesystem::path out = argv[1];
  CLI::App app;
  int exit_code = 0;
  retryloop::cli::build_command_line(app, exit_code);
  bool written = true;
  for (const auto& page : retryloop::cli::man_pages(app, RETRYLOOP_VERSION, build_date()))
    written = write_file(out / "man" / page.file_name, page.text) && written;
  written =
      write_file(out / "bash-completion" / "retryloop", retryloop::cli::bash_completion(app)) &&
      written;
  return written ? 0 : 1;
}
