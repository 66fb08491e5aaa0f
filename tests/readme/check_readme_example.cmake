# The README's retry-consumer example compiles without a warning, with the project's warnings.
# Its #include lines go first, its other lines into main(), after stand-ins for the functions it
# leaves to the application (looks_valid, charge, CustomerGone, page_someone).
#
#   cmake -DREADME=... -DWORK_DIR=... -DCOMPILER=... -DINCLUDE_DIR=... "-DFLAGS=..." -P <this>
#   cmake -DREADME=... -DWORK_DIR=... -DSOURCE_ONLY=ON -P <this>   only write the program, as
#                                    WORK_DIR/readme_example.cpp (to build it elsewhere)
file(READ "${README}" text)
string(FIND "${text}" "## The retry consumer" section)
if(section EQUAL -1)
  message(FATAL_ERROR "README: no section '## The retry consumer'")
endif()
string(SUBSTRING "${text}" ${section} -1 text)
string(FIND "${text}" "```cpp\n" open)
if(open EQUAL -1)
  message(FATAL_ERROR "README: no ```cpp block in '## The retry consumer'")
endif()
math(EXPR open "${open} + 7")
string(SUBSTRING "${text}" ${open} -1 text)
string(FIND "${text}" "```" close)
string(SUBSTRING "${text}" 0 ${close} block)

set(includes "")
set(body "")
string(REPLACE ";" "\\;" block "${block}")
string(REPLACE "\n" ";" lines "${block}")
foreach(line IN LISTS lines)
  if(line MATCHES "^#include")
    string(APPEND includes "${line}\n")
  else()
    string(APPEND body "  ${line}\n")
  endif()
endforeach()

file(MAKE_DIRECTORY "${WORK_DIR}")
set(source "${WORK_DIR}/readme_example.cpp")
file(WRITE "${source}" "${includes}
#include <stdexcept>
#include <string>

// What the example leaves to the application.
static bool looks_valid(const std::string& body) { return !body.empty(); }
static void charge(const std::string&) {}
struct CustomerGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};
static void page_someone(const std::string&, const std::string&) {}

int main() {
${body}  return 0;
}
")
if(SOURCE_ONLY)
  return()
endif()
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
execute_process(COMMAND "${COMPILER}" -std=c++17 -fsyntax-only ${flags} -Werror "-I${INCLUDE_DIR}"
                        "${source}"
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "README example (${source}) does not compile cleanly:\n${out}")
endif()
message(STATUS "README example compiles without warnings: ${source}")
