// Parses arbitrary text as a topology file. Oracle: it never crashes or throws; a file it
// accepts validates clean and plans; a file it refuses says why, with a message for each error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "retryloop/topology/plan.hpp"
#include "retryloop/topology/topology_json.hpp"

using namespace retryloop::topology;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  ParseResult result = parse_topology(text, "fuzz.json");
  if (!result.ok()) {
    check(!result.errors.empty());
    for (const auto& error : result.errors)
      check(!error.message.empty());
    check(result.messages().size() == result.errors.size());
    return 0;
  }
  check(result.errors.empty());
  check(validate(*result.topology).empty());
  Plan plan = make_plan(*result.topology);
  for (const auto& action : plan.actions) {
    check(!action.name.empty() || action.kind == ActionKind::bind_queue);
    // Wait queues never expire, whatever the file says.
    check(action.arguments.find("x-expires") == nullptr);
  }
  make_delete_plan(*result.topology);
  return 0;
}
