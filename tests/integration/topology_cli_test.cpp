#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "retryloop/client/connection.hpp"
#include "support/harness.hpp"
#include "support/process.hpp"

using namespace retryloop;
using test::CommandRun;
using test::contains;
namespace fs = std::filesystem;

namespace {

/// The retryloop binary: RETRYLOOP_BIN, else `retryloop` at the top of the build tree (this test
/// runs from <build>/tests/integration).
std::string cli_path() {
  if (const char* env = std::getenv("RETRYLOOP_BIN"); env != nullptr && *env != '\0') return env;
  fs::path exe = fs::read_symlink("/proc/self/exe");
  fs::path candidate = exe.parent_path().parent_path().parent_path() / "retryloop";
  INFO("looked for the retryloop binary at " << candidate.string()
                                             << "; build it, or set RETRYLOOP_BIN");
  REQUIRE(fs::exists(candidate));
  return candidate.string();
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

/// Where the binary's standard output goes.
enum class Output { captured, full_device, closed_pipe };

/// Runs the binary with `args`; `url` (when not empty) becomes RETRYLOOP_URL, otherwise the
/// variable is removed from the environment.
CommandRun run_cli(const std::vector<std::string>& args, const std::string& url = {},
                   Output output = Output::captured) {
  static int counter = 0;
  std::string stem = "retryloop-cli-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
  fs::path out_path = fs::temp_directory_path() / (stem + ".out");
  fs::path err_path = fs::temp_directory_path() / (stem + ".err");
  std::string binary = cli_path();

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("RETRYLOOP_URL=", 0) != 0) env_strings.emplace_back(*e);
  }
  if (!url.empty()) env_strings.push_back("RETRYLOOP_URL=" + url);
  std::vector<char*> envp;
  for (auto& s : env_strings)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings)
    argv.push_back(s.data());
  argv.push_back(nullptr);

  int pipe_ends[2] = {-1, -1};
  if (output == Output::closed_pipe) {
    REQUIRE(pipe(pipe_ends) == 0);
    close(pipe_ends[0]);  // no reader: every write fails with EPIPE
  }
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int out = output == Output::closed_pipe ? pipe_ends[1]
              : output == Output::full_device
                  ? open("/dev/full", O_WRONLY)
                  : open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0 || err < 0) _exit(127);
    dup2(out, 1);
    dup2(err, 2);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (pipe_ends[1] >= 0) close(pipe_ends[1]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CommandRun run;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.out = slurp(out_path);
  run.err = slurp(err_path);
  fs::remove(out_path);
  fs::remove(err_path);
  return run;
}

std::string data_file(const std::string& relative) {
  return (fs::path(RETRYLOOP_SOURCE_DIR) / "tests" / "data" / "topology" / relative).string();
}

/// A topology file with one service named `name`, in the temp directory; removed on scope exit.
class TempTopology {
 public:
  explicit TempTopology(const std::string& name) {
    path_ = fs::temp_directory_path() / (name + ".json");
    std::ofstream out(path_);
    out << R"({"services": [{"name": ")" << name << R"(", "input": {"exchange": ")" << name
        << R"(.in", "type": "direct", "bindings": ["key"]}, "retry": {"delays": ["30s"], )"
        << R"("max_attempts": 5}, "parking": {"max_length": 100}}]})";
  }
  ~TempTopology() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

}  // namespace

TEST_CASE("retryloop exits 2 for an invalid topology file and names the field path on stderr",
          "[cli][integration]") {
  CommandRun run = run_cli({"topology", "plan", data_file("invalid/delay_not_duration.json")});
  INFO(run.err);
  CHECK(run.exit_code == 2);
  CHECK(contains(run.err, "services[0].retry.delays[0]"));
  CHECK(contains(run.err, "\"3x\" is not a duration"));
  CHECK(run.out.empty());

  CommandRun apply = run_cli({"topology", "apply", data_file("invalid/several_errors.json"),
                              "--url", "amqp://guest:guest@127.0.0.1:1/"});
  CHECK(apply.exit_code == 2);  // the file is checked before any connection is tried
  CHECK(contains(apply.err, "services[1].retry.max_attempts"));
  CHECK(contains(apply.err, "services[2].name"));

  CommandRun missing = run_cli({"topology", "verify", data_file("no-such-file.json")});
  CHECK(missing.exit_code == 2);
  CHECK(contains(missing.err, "cannot read the file"));
}

TEST_CASE("retryloop exits 1 for a usage error", "[cli][integration]") {
  std::string file = data_file("valid/minimal.json");
  CommandRun unknown = run_cli({"topology", "verify", "--bogus", file});
  INFO(unknown.err);
  CHECK(unknown.exit_code == 1);
  CHECK(contains(unknown.err, "--bogus"));
  CHECK(run_cli({"topology", "apply"}).exit_code == 1);
  CHECK(run_cli({}).exit_code == 1);
  CHECK(run_cli({"topology"}).exit_code == 1);
  CHECK(run_cli({"topology", "frobnicate", file}).exit_code == 1);
  CommandRun bad_url = run_cli({"topology", "verify", file, "--url", "http://example"});
  CHECK(bad_url.exit_code == 1);
  CHECK(contains(bad_url.err, "invalid broker URL"));
  CommandRun unknown_service = run_cli({"topology", "plan", file, "--service", "nope"});
  CHECK(unknown_service.exit_code == 1);
  CHECK(contains(unknown_service.err, "no service named \"nope\""));
}

TEST_CASE("retryloop --help exits 0 and documents the exit codes", "[cli][integration]") {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--help"}, {"topology", "--help"}, {"topology", "apply", "--help"}}) {
    CommandRun run = run_cli(args);
    INFO(run.out);
    CHECK(run.exit_code == 0);
    CHECK(contains(run.out, "Exit codes:"));
    CHECK(contains(run.out, "4  cannot connect"));
  }
  CommandRun apply_help = run_cli({"topology", "apply", "--help"});
  CHECK(contains(apply_help.out, "RETRYLOOP_URL"));
  CHECK_FALSE(contains(apply_help.out, "guest:guest"));
}

TEST_CASE("The README and the topology guide document every exit code", "[cli]") {
  for (const char* doc : {"README.md", "docs/topology.md"}) {
    std::string text = slurp(fs::path(RETRYLOOP_SOURCE_DIR) / doc);
    INFO(doc);
    size_t section = text.find("xit codes");
    REQUIRE(section != std::string::npos);
    for (const char* row : {"| 0 | success", "| 1 | usage error", "| 2 | the topology file",
                            "| 3 | the broker refused", "| 4 | cannot connect"}) {
      INFO(row);
      CHECK(text.find(row, section) != std::string::npos);
    }
  }
}

TEST_CASE("retryloop exits 4 when the broker is unreachable and never shows the password",
          "[cli][integration]") {
  std::string file = data_file("valid/minimal.json");
  CommandRun flag =
      run_cli({"topology", "apply", file, "--url", "amqp://alice:s3cret@127.0.0.1:1/"});
  INFO(flag.err);
  CHECK(flag.exit_code == 4);
  CHECK(contains(flag.err, "cannot connect to amqp://alice:***@127.0.0.1:1/"));
  CHECK_FALSE(contains(flag.out + flag.err, "s3cret"));

  CommandRun env = run_cli({"topology", "verify", file}, "amqp://alice:s3cret@127.0.0.1:1/");
  CHECK(env.exit_code == 4);
  CHECK_FALSE(contains(env.out + env.err, "s3cret"));
  // verify shows the breaker each service's consumers will use before it connects.
  CHECK(contains(env.out, "  orders breaker: opens after 5 unavailable in a row"));

  // --url wins over RETRYLOOP_URL, both ways round.
  CommandRun url_wins =
      run_cli({"topology", "verify", file, "--url", "amqp://alice:s3cret@127.0.0.1:1/"},
              test::broker_url());
  CHECK(url_wins.exit_code == 4);
  CommandRun url_wins_too =
      run_cli({"topology", "verify", file, "--url", test::broker_url()}, "amqp://a:b@127.0.0.1:1/");
  INFO(url_wins_too.out << url_wins_too.err);
  CHECK(url_wins_too.exit_code == 3);  // connected; minimal.json is not applied: missing objects
  CHECK(contains(url_wins_too.out, "missing"));

  CommandRun wrong_password =
      run_cli({"topology", "verify", file, "--url",
               "amqp://guest:wrong-s3cret@" + client::parse_uri(test::broker_url()).host + ":" +
                   std::to_string(client::parse_uri(test::broker_url()).port) + "/"});
  INFO(wrong_password.err);
  CHECK(wrong_password.exit_code == 4);
  CHECK_FALSE(contains(wrong_password.out + wrong_password.err, "wrong-s3cret"));
  CHECK(contains(wrong_password.err, "amqp://guest:***@"));
}

TEST_CASE("A password never appears in a usage error, however the URL is malformed or misplaced",
          "[cli][integration]") {
  std::string file = data_file("valid/minimal.json");
  struct Case {
    std::vector<std::string> args;
    const char* shown;
  };
  // A password with an unencoded '?', '/' or '#' makes the parser read part of it as a port or a
  // query option; a URL given without --url is echoed by the argument parser.
  const std::vector<Case> cases = {
      {{"topology", "verify", file, "--url", "amqp://alice:ab?cd@127.0.0.1:1/"},
       "URI port must be a number from 1 to 65535, not '***'"},
      {{"topology", "verify", file, "--url", "amqp://alice:ab?cd=1@127.0.0.1:1/"}, "'***'"},
      {{"topology", "verify", file, "--url", "amqp://alice:ab/cd@127.0.0.1"}, "'***'"},
      {{"topology", "verify", file, "--url", "amqp://alice:abcd@127.0.0.1:1/?heartbeat=abcd"},
       "URI heartbeat must be a number from 0 to 65535, not '***'"},
      {{"topology", "apply", file, "amqp://alice:abcd@127.0.0.1:1/"},
       "not expected: amqp://alice:***@127.0.0.1:1/"},
      {{"topology", "apply", file, "amqp://alice:ab cd@127.0.0.1:1/"},
       "not expected: amqp://alice:***@127.0.0.1:1/"},
      {{"topology", "plan", file, "--jsn", "amqp://alice:abcd@h/", "x"}, "amqp://alice:***@h/"},
  };
  for (const auto& c : cases) {
    CommandRun run = run_cli(c.args);
    INFO(c.args.back() << "\n" << run.out << run.err);
    CHECK(run.exit_code == 1);
    CHECK(contains(run.err, c.shown));
    CHECK_FALSE(contains(run.out + run.err, "ab?cd"));
    CHECK_FALSE(contains(run.out + run.err, "abcd@"));
    CHECK_FALSE(contains(run.out + run.err, "ab cd"));
    CHECK_FALSE(contains(run.out + run.err, "'ab'"));
    CHECK_FALSE(contains(run.out + run.err, "'cd"));
  }
  // A value that is not from the password is still shown.
  CommandRun port =
      run_cli({"topology", "verify", file, "--url", "amqp://alice:abcd@127.0.0.1:99999/"});
  CHECK(contains(port.err, "not '99999'"));
}

TEST_CASE("plan and export need no broker and print what apply would declare",
          "[cli][integration]") {
  std::string file = data_file("valid/all_features.json");
  CommandRun plan = run_cli({"topology", "plan", file, "--url", "amqp://guest:guest@127.0.0.1:1/"});
  INFO(plan.err);
  CHECK(plan.exit_code == 0);
  CHECK(contains(plan.out, "x-message-ttl = 250 (250ms)"));
  CHECK(contains(plan.out, "alternate-exchange = orders.parking"));
  CHECK(contains(plan.out, "Nothing is sent to a broker"));
  // Each service's breaker, under its summary: the defaults, or what the file sets.
  CHECK(contains(plan.out, "  breaker: opens after 5 unavailable in a row; probes every 5s"));
  CHECK(contains(plan.out,
                 "  breaker: opens after 3 unavailable in a row or at 25% failed of at "
                 "least 50 calls in 30s; probes every 1s; ramps from an eighth of the "
                 "concurrency (at least 2), doubling every 500ms"));

  CommandRun json = run_cli({"topology", "plan", file, "--json", "--service", "payments"});
  CHECK(json.exit_code == 0);
  auto parsed = nlohmann::json::parse(json.out);
  CHECK(parsed["services"] == nlohmann::json::array({"payments"}));
  CHECK(parsed["actions"][0]["action"] == "declare_exchange");
  CHECK(parsed["actions"][0]["exchange"] == "payments.parking");
  CHECK(parsed["outage"]["payments"]["consecutive_unavailable"] == 3);
  CHECK(parsed["outage"]["payments"]["failure_rate"]["minimum_calls"] == 50);

  CommandRun exported = run_cli({"topology", "export", file, "--vhost", "staging"});
  CHECK(exported.exit_code == 0);
  auto definitions = nlohmann::json::parse(exported.out);
  CHECK(definitions["queues"][0]["vhost"] == "staging");
  CommandRun from_url =
      run_cli({"topology", "export", file}, "amqp://guest:guest@127.0.0.1:1/production");
  CHECK(nlohmann::json::parse(from_url.out)["exchanges"][0]["vhost"] == "production");
}

TEST_CASE("Output that cannot be written exits 6, quietly for a closed pipe",
          "[cli][integration]") {
  std::string file = data_file("valid/all_features.json");
  CommandRun full = run_cli({"topology", "plan", file}, {}, Output::full_device);
  CHECK(full.exit_code == 6);
  CHECK(contains(full.err, "cannot write to standard output: No space left on device"));

  CommandRun closed = run_cli({"topology", "export", file}, {}, Output::closed_pipe);
  CHECK(closed.exit_code == 6);
  CHECK(closed.err.empty());

  CommandRun help = run_cli({"--help"}, {}, Output::full_device);
  CHECK(help.exit_code == 6);
}

TEST_CASE("apply, verify and delete through the command line, with drift exiting 3",
          "[cli][integration]") {
  std::string url = test::broker_url();
  std::string name = test::unique_name("cli");
  TempTopology file(name);

  CommandRun first = run_cli({"topology", "apply", file.path()}, url);
  INFO(first.out << first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(contains(first.out, "created  queue     " + name));
  CHECK(contains(first.out, "Done: 6 created, 4 bindings in place."));

  CommandRun second = run_cli({"topology", "apply", file.path(), "--url", url});
  INFO(second.out << second.err);
  CHECK(second.exit_code == 0);
  CHECK_FALSE(contains(second.out, "created"));
  CHECK(contains(second.out, "Done: 6 already existed, 4 bindings in place."));

  CommandRun verified = run_cli({"topology", "verify", file.path(), "--url", url});
  CHECK(verified.exit_code == 0);
  CHECK(contains(verified.out, "Result: 6 match."));
  CHECK(contains(verified.out, "4 bindings were not checked"));

  CommandRun exists_only =
      run_cli({"topology", "verify", file.path(), "--url", url, "--exists-only"});
  INFO(exists_only.out << exists_only.err);
  CHECK(exists_only.exit_code == 0);
  CHECK(contains(exists_only.out, "exists     queue     " + name + ".wait.30s"));
  CHECK(contains(exists_only.out, "Result: 6 exist."));
  CHECK(contains(exists_only.out, "drift is not detected"));

  // The service queue deleted while its wait queues stay: verify says what becomes of a retry.
  {
    test::TestLoop loop;
    auto connection = test::connect(loop, url);
    auto channel = test::open_channel(loop, *connection);
    REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
      return channel->queue_delete(name, false, false,
                                   [cb](const client::Error& e, uint32_t) { cb(e); });
    }));
    test::close(loop, connection);
  }
  CommandRun no_queue = run_cli({"topology", "verify", file.path(), "--url", url});
  INFO(no_queue.out << no_queue.err);
  CHECK(no_queue.exit_code == 3);
  CHECK(contains(no_queue.out, "Queue " + name + " is missing but its wait queues exist"));
  CHECK(contains(no_queue.out, "goes to parking"));
  CHECK(contains(no_queue.out, "retryloop parking replay " + name + " --reason unrouted"));
  REQUIRE(run_cli({"topology", "apply", file.path(), "--url", url}).exit_code == 0);

  // Change the wait queue behind the tool's back.
  {
    test::TestLoop loop;
    auto connection = test::connect(loop, url);
    auto channel = test::open_channel(loop, *connection);
    REQUIRE_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
      return channel->queue_delete(name + ".wait.30s", false, false,
                                   [cb](const client::Error& e, uint32_t) { cb(e); });
    }));
    client::QueueOptions options;
    options.arguments.append("x-message-ttl", int32_t{45000});
    test::declare_queue(loop, *channel, name + ".wait.30s", options);
    test::close(loop, connection);
  }

  CommandRun drifted = run_cli({"topology", "verify", file.path(), "--url", url});
  INFO(drifted.out << drifted.err);
  CHECK(drifted.exit_code == 3);
  CHECK(contains(drifted.out, "drifted"));
  CHECK(contains(drifted.out, "x-message-ttl: the file wants 30000, the broker has 45000"));

  // --exists-only does not see drift, by design.
  CHECK(run_cli({"topology", "verify", file.path(), "--url", url, "--exists-only"}).exit_code == 0);

  CommandRun drifted_json = run_cli({"topology", "verify", file.path(), "--url", url, "--json"});
  CHECK(drifted_json.exit_code == 3);
  auto report = nlohmann::json::parse(drifted_json.out);
  CHECK(report["ok"] == false);
  bool named = false;
  for (const auto& r : report["results"]) {
    if (r["outcome"] == "drifted") {
      named = true;
      CHECK(r["queue"] == name + ".wait.30s");
      CHECK(r["drift"]["argument"] == "x-message-ttl");
      CHECK(r["drift"]["wanted"] == "30000");
      CHECK(r["drift"]["actual"] == "45000");
      CHECK(r["reply_code"] == 406);
    }
  }
  CHECK(named);

  CommandRun reapplied = run_cli({"topology", "apply", file.path(), "--url", url});
  CHECK(reapplied.exit_code == 3);
  CHECK(contains(reapplied.err, "nothing was deleted or changed"));

  CommandRun dry = run_cli({"topology", "delete", file.path(), "--url", url});
  INFO(dry.out << dry.err);
  CHECK(dry.exit_code == 0);
  CHECK(contains(dry.out, "Nothing was deleted. Run again with --yes"));
  CHECK(contains(dry.out, "would delete"));

  CommandRun deleted = run_cli({"topology", "delete", file.path(), "--url", url, "--yes"});
  INFO(deleted.out << deleted.err);
  CHECK(deleted.exit_code == 0);
  // Absent: the shared breaker's 4 objects and a migration's 4, which no consumer declared.
  CHECK(contains(deleted.out, "Done: 5 deleted, 8 were already absent."));
  CHECK(contains(deleted.out, "Input exchanges are never deleted (" + name + ".in)"));

  CommandRun gone = run_cli({"topology", "verify", file.path(), "--url", url});
  CHECK(gone.exit_code == 3);
  CHECK(contains(gone.out, "missing"));
  CHECK_FALSE(contains(gone.out + gone.err + first.out + deleted.out, ":guest@"));

  test::TestLoop loop;
  auto connection = test::connect(loop, url);
  auto channel = test::open_channel(loop, *connection);
  CHECK_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_delete(name + ".in", false, cb);
  }));
  test::close(loop, connection);
}

TEST_CASE("delete through the command line refuses a queue that holds messages",
          "[cli][integration]") {
  std::string url = test::broker_url();
  std::string name = test::unique_name("cli.delete");
  TempTopology file(name);
  REQUIRE(run_cli({"topology", "apply", file.path(), "--url", url}).exit_code == 0);
  {
    test::TestLoop loop;
    auto connection = test::connect(loop, url);
    auto channel = test::open_channel(loop, *connection);
    REQUIRE_FALSE(test::wait(
        loop, [&](client::CompletionCallback cb) { return channel->confirm_select(cb); }));
    bool done = false;
    REQUIRE_FALSE(channel->publish(name + ".parking", "", {}, "parked", client::Mandatory::yes,
                                   [&](const client::PublishOutcome& o) {
                                     CHECK(o.ok());
                                     done = true;
                                   }));
    REQUIRE(loop.run_until([&] { return done; }));
    test::close(loop, connection);
  }
  CommandRun dry = run_cli({"topology", "delete", file.path(), "--url", url});
  INFO(dry.out << dry.err);
  CHECK(dry.exit_code == 3);
  CHECK(contains(dry.out, "not empty  queue     " + name + ".parking"));
  CHECK(contains(dry.out, "1 message, 0 consumers"));
  CHECK(contains(dry.err, "--yes would refuse"));

  CommandRun refused = run_cli({"topology", "delete", file.path(), "--url", url, "--yes"});
  INFO(refused.out << refused.err);
  CHECK(refused.exit_code == 3);
  CHECK(contains(refused.out, "Nothing was deleted: " + name + ".parking holds 1 message."));
  CHECK(contains(refused.err, "refusing to delete"));
  CHECK(contains(refused.err, "--force"));
  CHECK(run_cli({"topology", "verify", file.path(), "--url", url}).exit_code == 0);

  CommandRun forced =
      run_cli({"topology", "delete", file.path(), "--url", url, "--yes", "--force"});
  CHECK(forced.exit_code == 0);

  test::TestLoop loop;
  auto connection = test::connect(loop, url);
  auto channel = test::open_channel(loop, *connection);
  CHECK_FALSE(test::wait(loop, [&](client::CompletionCallback cb) {
    return channel->exchange_delete(name + ".in", false, cb);
  }));
  test::close(loop, connection);
}

TEST_CASE("apply, verify, export and delete with delay levels through the command line",
          "[cli][delay-levels][integration]") {
  const std::string url = test::broker_url();
  const std::string name = test::unique_name("clilevels");
  const fs::path path = fs::temp_directory_path() / (name + ".json");
  {
    std::ofstream out(path);
    out << R"({"services": [{"name": ")" << name << R"(", "input": {"exchange": ")" << name
        << R"(.in", "type": "direct", "bindings": ["key"]}, "retry": {"mode": "republish", )"
        << R"("max_attempts": 9, "delay_levels": {"base": "3ms", "levels": 4}, )"
        << R"("backoff": {"initial": "10ms", "max": "40ms"}}}]})";
  }
  struct Remove {
    fs::path path;
    ~Remove() { fs::remove(path); }
  } remove{path};

  CommandRun applied = run_cli({"topology", "apply", path.string()}, url);
  INFO(applied.out << applied.err);
  REQUIRE(applied.exit_code == 0);
  CHECK(contains(applied.out, "queue     retryloop.delay.3ms.03"));
  CHECK(
      contains(applied.out, "binding   retryloop.delay.3ms.03 -> exchange retryloop.delay.3ms.02"));
  CHECK(contains(applied.out, "binding   retryloop.delay.3ms.deliver -> " + name));

  CommandRun again = run_cli({"topology", "apply", path.string()}, url);
  INFO(again.out << again.err);
  CHECK(again.exit_code == 0);
  CHECK_FALSE(contains(again.out, "created"));

  CommandRun verified = run_cli({"topology", "verify", path.string()}, url);
  INFO(verified.out << verified.err);
  CHECK(verified.exit_code == 0);
  CHECK(contains(verified.out, "ok         queue     retryloop.delay.3ms.00"));
  CHECK(contains(verified.out, "Result: 16 match."));

  CommandRun exported = run_cli({"topology", "export", path.string()});
  INFO(exported.out << exported.err);
  REQUIRE(exported.exit_code == 0);
  auto definitions = nlohmann::json::parse(exported.out);
  size_t to_exchange = 0;
  for (const auto& b : definitions["bindings"]) {
    if (b["destination_type"] == "exchange") ++to_exchange;
  }
  CHECK(to_exchange == 4);

  CommandRun deleted = run_cli({"topology", "delete", path.string(), "--yes"}, url);
  INFO(deleted.out << deleted.err);
  CHECK(deleted.exit_code == 0);
  CHECK(contains(deleted.out, "Delay levels are never deleted (retryloop.delay.3ms.*)"));
  CHECK_FALSE(contains(deleted.out, "retryloop.delay.3ms.00"));
}

TEST_CASE("topology plan prints the vhost's objects that belong to no service",
          "[cli][integration]") {
  const auto file = std::filesystem::temp_directory_path() /
                    ("audit-only-" + std::to_string(::getpid()) + ".json");
  std::ofstream(file) << R"({"audit": {"max_age": "90d"}})";
  CommandRun audit = run_cli({"topology", "plan", file.string()});
  INFO(audit.err);
  CHECK(audit.exit_code == 0);
  CHECK(contains(audit.out, "retryloop.audit"));
  CHECK(contains(audit.out, "stream, durable"));
  CHECK(contains(audit.out, "x-max-age = 7776000s"));
  CommandRun scheduled =
      run_cli({"topology", "plan",
               (fs::path(RETRYLOOP_SOURCE_DIR) / "topology" / "scheduled.json").string()});
  INFO(scheduled.err);
  CHECK(scheduled.exit_code == 0);
  CHECK(contains(scheduled.out, "retryloop.delay.1s.quorum.deliver"));
  std::filesystem::remove(file);
}
