# cmake -DOUTPUT=FILE -DHTML=FILE -DSCRIPT=FILE -DSTYLE=FILE -P embed_console_page.cmake
#
# Writes the C++ source that embeds the parking console's page, script and style sheet as raw
# string literals (the definitions that src/console/page.hpp declares).

cmake_minimum_required(VERSION 3.21)

set(delimiter "retryloop_page")
set(text "// Made by cmake/embed_console_page.cmake from src/console/page/: edit those files.\n\n")
string(APPEND text "#include <string_view>\n\nnamespace retryloop::console::detail {\n")
foreach(part HTML SCRIPT STYLE)
  file(READ ${${part}} content)
  string(FIND "${content}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${${part}} holds the raw string's end, )${delimiter}\"")
  endif()
  if(part STREQUAL "HTML")
    set(name page_html)
  elseif(part STREQUAL "SCRIPT")
    set(name page_script)
  else()
    set(name page_style)
  endif()
  string(APPEND text "\nextern const std::string_view ${name} = R\"${delimiter}(${content})${delimiter}\";\n")
endforeach()
string(APPEND text "\n}  // namespace retryloop::console::detail\n")
# Rewrite only on a change, so that an unchanged page compiles nothing again.
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
  if(old STREQUAL text)
    return()
  endif()
endif()
file(WRITE ${OUTPUT} "${text}")
