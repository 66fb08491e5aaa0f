# cmake -DBUILD_DIR=... -DWORK_DIR=... -DGENERATOR=... -P check_install.cmake
#
# Installs the build into WORK_DIR/prefix, then builds and runs tests/install against that
# prefix alone, with find_package and with pkg-config.
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
execute_process(COMMAND ${WORK_DIR}/build/uses_retryloop RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the program built against the installed package failed (${rc})")
endif()

# The same program with pkg-config and the compiler alone.
file(GLOB pc_dirs ${WORK_DIR}/prefix/lib*/pkgconfig ${WORK_DIR}/prefix/lib/*/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "${pc_dirs}")
execute_process(COMMAND pkg-config --cflags --libs retryloop
                OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "pkg-config does not find retryloop in ${pc_dirs}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
execute_process(COMMAND c++ -std=c++17 ${CMAKE_CURRENT_LIST_DIR}/uses_retryloop.cpp ${flags}
                        -o ${WORK_DIR}/uses_retryloop_pc RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "compiling with pkg-config's flags failed (${rc})")
endif()
execute_process(COMMAND ${WORK_DIR}/uses_retryloop_pc RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the program built with pkg-config failed (${rc})")
endif()
