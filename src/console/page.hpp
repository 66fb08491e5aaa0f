#pragma once

#include <string_view>

namespace retryloop::console::detail {

// The console's page, script and style sheet, embedded at build time from src/console/page/
// (cmake/embed_console_page.cmake): the binary needs no other file and loads nothing from
// elsewhere.
extern const std::string_view page_html;
extern const std::string_view page_script;
extern const std::string_view page_style;

}  // namespace retryloop::console::detail
