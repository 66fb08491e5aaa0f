# cmake -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -P check_install.cmake
#
# Installs the build into WORK_DIR/prefix, then builds and runs tests/install against that
# prefix alone, with find_package and with pkg-config, on the static layers and on
# libretryloop.so; checks that the installed headers are the public ones only, and that the
# shared library has its SONAME and exports nothing but the retryloop:: API.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
          -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring against the installed package failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building against the installed package failed (${rc})")
endif()
foreach(program uses_retryloop uses_retryloop_shared)
  execute_process(COMMAND ${WORK_DIR}/build/${program} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${program}, built against the installed package, failed (${rc})")
  endif()
endforeach()

# Internal headers (the wire codec, the channel's bookkeeping) are not installed.
foreach(internal amqp/frame.hpp amqp/methods.hpp amqp/buffer.hpp client/detail/ack_ledger.hpp)
  if(EXISTS ${WORK_DIR}/prefix/include/retryloop/${internal})
    message(FATAL_ERROR "an internal header was installed: ${internal}")
  endif()
endforeach()

# The shared library: its SONAME, and no symbol outside namespace retryloop exported.
file(GLOB shared ${WORK_DIR}/prefix/lib*/libretryloop.so ${WORK_DIR}/prefix/lib/*/libretryloop.so)
if(NOT shared)
  message(FATAL_ERROR "libretryloop.so was not installed")
endif()
execute_process(COMMAND objdump -p ${shared} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(rc OR NOT dynamic MATCHES "SONAME +libretryloop\\.so\\.${SOVERSION}\n")
  message(FATAL_ERROR "libretryloop.so has no SONAME libretryloop.so.${SOVERSION}")
endif()
execute_process(COMMAND nm -D --defined-only -C ${shared} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "nm could not read ${shared}")
endif()
string(REPLACE "\n" ";" symbols "${symbols}")
set(foreign)
set(exported 0)
foreach(line IN LISTS symbols)
  if(line STREQUAL "")
    continue()
  endif()
  if(line MATCHES "retryloop::" OR line MATCHES " RETRYLOOP_[0-9.]+$")
    math(EXPR exported "${exported} + 1")
  else()
    list(APPEND foreign "${line}")
  endif()
endforeach()
if(foreign)
  list(LENGTH foreign count)
  list(SUBLIST foreign 0 10 some)
  string(REPLACE ";" "\n  " some "${some}")
  message(FATAL_ERROR "libretryloop.so exports ${count} symbols outside namespace retryloop:\n  ${some}")
endif()
if(exported LESS 100)
  message(FATAL_ERROR "libretryloop.so exports only ${exported} symbols: is the API in it?")
endif()
message(STATUS "libretryloop.so exports ${exported} symbols, all of namespace retryloop")

# The same program with pkg-config and the compiler alone.
file(GLOB pc_dirs ${WORK_DIR}/prefix/lib*/pkgconfig ${WORK_DIR}/prefix/lib/*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
get_filename_component(shared_dir ${shared} DIRECTORY)
foreach(package retryloop retryloop-shared)
  execute_process(COMMAND pkg-config --cflags --libs ${package}
                  OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "pkg-config does not find ${package} in ${pc_dirs}")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  execute_process(COMMAND c++ -std=c++17 ${CMAKE_CURRENT_LIST_DIR}/uses_retryloop.cpp ${flags}
                          -Wl,-rpath,${shared_dir} -o ${WORK_DIR}/uses_${package}_pc
                  RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "compiling with pkg-config's flags for ${package} failed (${rc})")
  endif()
  execute_process(COMMAND ${WORK_DIR}/uses_${package}_pc RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "the program built with pkg-config (${package}) failed (${rc})")
  endif()
endforeach()
