# A header of layer low kept in layer high's folder: check_layers.cmake must refuse it.
set(INCLUDE_ROOT "${CMAKE_CURRENT_LIST_DIR}/include")
set(LAYERS low high)
set(LAYER_low_FILES "${INCLUDE_ROOT}/retryloop/low/fine.hpp;${INCLUDE_ROOT}/retryloop/high/high.hpp")
set(LAYER_low_USES "")
set(LAYER_high_FILES "${INCLUDE_ROOT}/retryloop/high/uses_low.hpp")
set(LAYER_high_USES "low")
