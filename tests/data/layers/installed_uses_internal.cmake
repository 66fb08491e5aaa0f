# Layer high's installed header includes a header of layer low that is not installed: a program
# built against the installed package could not compile it, so check_layers.cmake must refuse it.
set(INCLUDE_ROOT "${CMAKE_CURRENT_LIST_DIR}/include")
set(LAYERS low high)
set(LAYER_low_FILES "${INCLUDE_ROOT}/retryloop/low/low.hpp;${INCLUDE_ROOT}/retryloop/low/fine.hpp")
set(LAYER_low_USES "")
set(LAYER_high_FILES "${INCLUDE_ROOT}/retryloop/high/uses_low.hpp")
set(LAYER_high_USES "low")
set(PUBLIC_HEADERS "${INCLUDE_ROOT}/retryloop/high/uses_low.hpp")
