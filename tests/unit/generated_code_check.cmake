# Regenerates the AMQP method code into WORK_DIR and fails if it differs from the committed files.
# Run as: cmake -DPYTHON=python3 -DSOURCE_DIR=<repo> -DWORK_DIR=<tmp> -P generated_code_check.cmake
set(regenerate "python3 tools/gen_amqp_methods.py")

if(NOT PYTHON)
  message(FATAL_ERROR "generated_code_check: python3 not found; it is needed to run the generator")
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
execute_process(
  COMMAND "${PYTHON}" "${SOURCE_DIR}/tools/gen_amqp_methods.py" --out-dir "${WORK_DIR}"
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "generated_code_check: the generator failed (exit ${result})")
endif()

set(stale "")
foreach(file include/retryloop/amqp/methods.hpp include/retryloop/amqp/properties.hpp
             src/amqp/methods.cpp)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -E compare_files "${SOURCE_DIR}/${file}" "${WORK_DIR}/${file}"
    RESULT_VARIABLE differs)
  if(NOT differs EQUAL 0)
    list(APPEND stale "${file}")
  endif()
endforeach()

if(stale)
  string(REPLACE ";" ", " stale "${stale}")
  message(FATAL_ERROR
    "generated_code_check: out of date: ${stale}\n"
    "The committed file differs from what tools/gen_amqp_methods.py generates from the spec.\n"
    "Do not edit generated files; change the generator, then regenerate from the repository "
    "root with:\n  ${regenerate}\nand commit the result.")
endif()
message(STATUS "generated_code_check: methods.hpp, properties.hpp and methods.cpp are up to date")
