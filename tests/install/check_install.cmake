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

# Internal headers (the wire codec, the channel's bookkeeping, the random source's test seam) are
# not installed.
foreach(internal amqp/frame.hpp amqp/methods.hpp amqp/buffer.hpp client/detail/ack_ledger.hpp
                 random/detail/source.hpp)
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

# The consumer component on a machine view without libpq, SQLite and cpp-httplib: a pkg-config
# directory with every .pc file of this machine but theirs (PKG_CONFIG_LIBDIR), and the installed
# package's own directory (PKG_CONFIG_PATH: its files find their prefix from their place).
set(view ${WORK_DIR}/view-without-sql-and-http)
file(MAKE_DIRECTORY ${view})
execute_process(COMMAND pkg-config --variable pc_path pkg-config
                OUTPUT_VARIABLE system_pc_path OUTPUT_STRIP_TRAILING_WHITESPACE)
string(REPLACE ":" ";" system_pc_dirs "${system_pc_path}")
foreach(dir IN LISTS system_pc_dirs)
  file(GLOB pc_files ${dir}/*.pc)
  foreach(pc IN LISTS pc_files)
    get_filename_component(name ${pc} NAME)
    if(NOT name MATCHES "^(sqlite3|libpq|cpp-httplib)\\.pc$" AND NOT EXISTS ${view}/${name})
      file(CREATE_LINK ${pc} ${view}/${name} SYMBOLIC)
    endif()
  endforeach()
endforeach()
set(ENV{PKG_CONFIG_LIBDIR} ${view})
set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
foreach(hidden sqlite3 libpq cpp-httplib)
  execute_process(COMMAND pkg-config --exists ${hidden} RESULT_VARIABLE rc)
  if(NOT rc)
    message(FATAL_ERROR "the machine view still has ${hidden}")
  endif()
endforeach()

# Every layer needs what the view lacks: asking for all of them must fail there.
file(WRITE ${WORK_DIR}/all-layers/CMakeLists.txt
     "cmake_minimum_required(VERSION 3.21)\nproject(all_layers LANGUAGES CXX)\n"
     "find_package(retryloop REQUIRED)\n")
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${WORK_DIR}/all-layers -B ${WORK_DIR}/all-layers/build
          -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(NOT rc)
  message(FATAL_ERROR "find_package(retryloop) found every layer on a view without libpq, "
                      "SQLite and cpp-httplib: the view hides nothing")
endif()

execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/consumer_only -B ${WORK_DIR}/consumer-only
          -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "find_package(retryloop COMPONENTS consumer) failed without libpq, SQLite "
                      "and cpp-httplib (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-only RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer-only program failed (${rc})")
endif()
execute_process(COMMAND pkg-config --cflags --libs retryloop-consumer
                OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "pkg-config does not find retryloop-consumer without libpq, SQLite and "
                      "cpp-httplib")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(
  COMMAND c++ -std=c++17 ${CMAKE_CURRENT_LIST_DIR}/consumer_only/uses_consumer_only.cpp ${flags}
          -o ${WORK_DIR}/uses_consumer_only_pc
  RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "compiling with pkg-config's flags for retryloop-consumer failed (${rc})")
endif()
foreach(program ${WORK_DIR}/consumer-only/uses_consumer_only ${WORK_DIR}/uses_consumer_only_pc)
  execute_process(COMMAND ${program} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "${program} failed (${rc})")
  endif()
  execute_process(COMMAND objdump -p ${program} OUTPUT_VARIABLE dynamic)
  if(dynamic MATCHES "NEEDED +(libpq|libsqlite3|libcpp-httplib)[^\n]*")
    message(FATAL_ERROR "${program} needs ${CMAKE_MATCH_0}")
  endif()
endforeach()
message(STATUS "a consumer-only program builds and runs without libpq, SQLite and cpp-httplib")
