# The library is built as layers, one static library each, and every layer names the layers it
# uses. A file of a layer may include only headers of that layer and of the layers it uses,
# directly or through another: the build checks it (cmake/check_layers.cmake), so an upward or
# sideways include fails the build instead of waiting for a review.
#
#   retryloop_layer(NAME
#     SOURCES   files under src/           (.cpp, and the layer's private .hpp)
#     HEADERS   files under include/       (the layer's public headers: installed)
#     INTERNAL_HEADERS files under include/  (used by other layers, tests and fuzz targets, but
#                                           not installed: the wire codec, pure bookkeeping)
#     USES      other layers, by NAME      (linked PUBLIC: their headers are part of this API)
#     LINK      other targets, PUBLIC ones first, then PRIVATE ...
#     FOLDER    the folder of its files, src/FOLDER/ and include/retryloop/FOLDER/ (default:
#               NAME; the check refuses a file elsewhere))
#
# Makes the target retryloop_NAME (alias retryloop::NAME).

function(retryloop_layer name)
  cmake_parse_arguments(LAYER "" "FOLDER" "SOURCES;HEADERS;INTERNAL_HEADERS;USES;LINK" ${ARGN})
  set(target retryloop_${name})
  add_library(${target} STATIC ${LAYER_SOURCES} ${LAYER_HEADERS} ${LAYER_INTERNAL_HEADERS})
  add_library(retryloop::${name} ALIAS ${target})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  foreach(used IN LISTS LAYER_USES)
    if(NOT TARGET retryloop_${used})
      message(FATAL_ERROR "layer ${name} uses ${used}, which is not defined before it")
    endif()
    target_link_libraries(${target} PUBLIC retryloop_${used})
  endforeach()
  target_link_libraries(${target} ${LAYER_LINK})
  target_compile_options(${target} PRIVATE ${RETRYLOOP_WARNINGS})
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME ${name})

  set(files ${LAYER_SOURCES} ${LAYER_HEADERS} ${LAYER_INTERNAL_HEADERS})
  retryloop_register_layer(${name} "${files}" "${LAYER_USES}")
  if(LAYER_FOLDER)
    set_property(GLOBAL PROPERTY RETRYLOOP_LAYER_${name}_FOLDER ${LAYER_FOLDER})
  endif()
  foreach(header IN LISTS LAYER_HEADERS)
    get_filename_component(path ${header} ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY RETRYLOOP_PUBLIC_HEADERS ${path})
  endforeach()
endfunction()

# Installs the public headers of every layer, each under include/ at its place in the tree.
function(retryloop_install_headers)
  get_property(headers GLOBAL PROPERTY RETRYLOOP_PUBLIC_HEADERS)
  foreach(header IN LISTS headers)
    file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR}/include ${header})
    get_filename_component(directory ${relative} DIRECTORY)
    install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${directory})
  endforeach()
endfunction()

# Records the files and the used layers of NAME for retryloop_check_layers.
function(retryloop_register_layer name files uses)
  set(paths)
  foreach(file IN LISTS files)
    get_filename_component(path ${file} ABSOLUTE)
    list(APPEND paths ${path})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY RETRYLOOP_LAYERS ${name})
  set_property(GLOBAL PROPERTY RETRYLOOP_LAYER_${name}_FILES ${paths})
  set_property(GLOBAL PROPERTY RETRYLOOP_LAYER_${name}_USES ${uses})
endfunction()

# The layers NAME uses, directly or not, into the variable OUT.
function(retryloop_layers_below name out)
  get_property(direct GLOBAL PROPERTY RETRYLOOP_LAYER_${name}_USES)
  set(all ${direct})
  foreach(used IN LISTS direct)
    retryloop_layers_below(${used} below)
    list(APPEND all ${below})
  endforeach()
  list(REMOVE_DUPLICATES all)
  set(${out} ${all} PARENT_SCOPE)
endfunction()

# Writes what each layer holds and may include to MANIFEST, and adds the target retryloop_layers
# (built by default) that checks every file of every layer against it.
function(retryloop_check_layers manifest)
  get_property(layers GLOBAL PROPERTY RETRYLOOP_LAYERS)
  set(text "set(LAYERS ${layers})\n")
  set(all_files)
  foreach(name IN LISTS layers)
    get_property(files GLOBAL PROPERTY RETRYLOOP_LAYER_${name}_FILES)
    retryloop_layers_below(${name} below)
    string(APPEND text "set(LAYER_${name}_FILES \"${files}\")\n")
    string(APPEND text "set(LAYER_${name}_USES \"${below}\")\n")
    get_property(folder GLOBAL PROPERTY RETRYLOOP_LAYER_${name}_FOLDER)
    string(APPEND text "set(LAYER_${name}_FOLDER \"${folder}\")\n")
    list(APPEND all_files ${files})
  endforeach()
  string(APPEND text "set(INCLUDE_ROOT \"${PROJECT_SOURCE_DIR}/include\")\n")
  string(APPEND text "set(SOURCE_ROOT \"${PROJECT_SOURCE_DIR}/src\")\n")
  get_property(public GLOBAL PROPERTY RETRYLOOP_PUBLIC_HEADERS)
  string(APPEND text "set(PUBLIC_HEADERS \"${public}\")\n")
  file(GENERATE OUTPUT ${manifest} CONTENT "${text}")
  set(stamp ${CMAKE_CURRENT_BINARY_DIR}/retryloop_layers.stamp)
  add_custom_command(
    OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DMANIFEST=${manifest} -P ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
    COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
    DEPENDS ${all_files} ${manifest} ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
    COMMENT "Checking that every layer includes only the layers it uses"
    VERBATIM)
  add_custom_target(retryloop_layers ALL DEPENDS ${stamp})
endfunction()

# Registers the files of a program built on the layers (the command line) for the same check.
function(retryloop_layer_program name)
  cmake_parse_arguments(LAYER "" "" "FILES;USES" ${ARGN})
  retryloop_register_layer(${name} "${LAYER_FILES}" "${LAYER_USES}")
endfunction()
