# cmake -DMANIFEST=FILE -P check_layers.cmake
#
# Fails, listing every offending line, when a file of a layer includes a retryloop header that
# belongs to neither that layer nor a layer it uses, or a local ("name.hpp") header that is not
# the layer's own; and when an installed (public) header includes a retryloop header that is not
# installed, which would break every program built against the installed package; and when a
# layer's file lies outside the layer's folder (src/FOLDER/, include/retryloop/FOLDER/; FOLDER is
# the layer's name unless LAYER_<name>_FOLDER says otherwise; generated files are exempt).
# MANIFEST (written by retryloop_check_layers) sets LAYERS, INCLUDE_ROOT, optionally SOURCE_ROOT,
# per layer LAYER_<name>_FILES and LAYER_<name>_USES (and LAYER_<name>_FOLDER), and
# PUBLIC_HEADERS.

cmake_minimum_required(VERSION 3.21)

if(NOT MANIFEST)
  message(FATAL_ERROR "check_layers.cmake: give the manifest with -DMANIFEST=FILE")
endif()
include(${MANIFEST})

# Which layer owns each header, by the path an include names it with.
foreach(name IN LISTS LAYERS)
  foreach(file IN LISTS LAYER_${name}_FILES)
    if(file MATCHES "\\.hpp$")
      file(RELATIVE_PATH included ${INCLUDE_ROOT} ${file})
      if(NOT included MATCHES "^\\.\\.")
        set(OWNER_${included} ${name})
      endif()
      get_filename_component(base ${file} NAME)
      list(APPEND LOCAL_${name} ${base})
    endif()
  endforeach()
endforeach()

set(problems)
foreach(name IN LISTS LAYERS)
  set(folder ${name})
  if(LAYER_${name}_FOLDER)
    set(folder ${LAYER_${name}_FOLDER})
  endif()
  foreach(file IN LISTS LAYER_${name}_FILES)
    string(FIND "${file}" "${INCLUDE_ROOT}/" in_include)
    set(in_source -1)
    if(SOURCE_ROOT)
      string(FIND "${file}" "${SOURCE_ROOT}/" in_source)
    endif()
    if(in_include EQUAL 0 AND NOT file MATCHES "^${INCLUDE_ROOT}/retryloop/${folder}/")
      list(APPEND problems "${file}: a header of layer ${name} outside its folder \
include/retryloop/${folder}/")
    elseif(in_source EQUAL 0 AND NOT file MATCHES "^${SOURCE_ROOT}/${folder}/")
      list(APPEND problems "${file}: a source of layer ${name} outside its folder src/${folder}/")
    endif()
  endforeach()
endforeach()
foreach(name IN LISTS LAYERS)
  set(allowed ${name} ${LAYER_${name}_USES})
  foreach(file IN LISTS LAYER_${name}_FILES)
    file(STRINGS ${file} lines REGEX "^#include \"")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
      if(included MATCHES "^retryloop/")
        set(owner "${OWNER_${included}}")
        if(owner STREQUAL "")
          list(APPEND problems "${file}: ${included} belongs to no layer")
        elseif(file IN_LIST PUBLIC_HEADERS AND NOT "${INCLUDE_ROOT}/${included}" IN_LIST
               PUBLIC_HEADERS)
          list(APPEND problems "${file}: an installed header includes ${included}, which is not \
installed (list it under HEADERS, or include it from a source file instead)")
        elseif(NOT owner IN_LIST allowed)
          string(REPLACE ";" ", " uses "${LAYER_${name}_USES}")
          if(uses STREQUAL "")
            set(uses "none")
          endif()
          list(APPEND problems "${file}: includes ${included} of layer ${owner}, which layer \
${name} does not use (it uses: ${uses})")
        endif()
      elseif(NOT included IN_LIST LOCAL_${name})
        list(APPEND problems "${file}: includes \"${included}\", which is not a header of layer ${name}")
      endif()
    endforeach()
  endforeach()
endforeach()

if(problems)
  list(LENGTH problems count)
  string(REPLACE ";" "\n  " text "${problems}")
  message(FATAL_ERROR "${count} include(s) cross the layers:\n  ${text}")
endif()
