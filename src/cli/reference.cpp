#include "reference.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

namespace retryloop::cli {
namespace {

// ---- The help texts, taken apart ----------------------------------------------------------------

/// A help footer: paragraphs of prose, then the exit-code table ("Exit codes:" and lines of
/// "  CODE  meaning", a meaning going on in more deeply indented lines).
struct Footer {
  std::vector<std::string> paragraphs;
  std::vector<std::pair<std::string, std::string>> exit_codes;
};

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return std::string(text.substr(first, last - first + 1));
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

Footer parse_footer(const std::string& text) {
  Footer footer;
  bool in_exit_codes = false;
  std::string paragraph;
  auto end_paragraph = [&] {
    if (!paragraph.empty()) footer.paragraphs.push_back(paragraph);
    paragraph.clear();
  };
  for (const auto& line : lines_of(text)) {
    const std::string trimmed = trim(line);
    if (trimmed == "Exit codes:") {
      end_paragraph();
      in_exit_codes = true;
    } else if (in_exit_codes) {
      if (trimmed.empty()) continue;
      const size_t digits = trimmed.find_first_not_of("0123456789");
      if (line.rfind("  ", 0) == 0 && line.size() > 2 &&
          std::isdigit(static_cast<unsigned char>(line[2])) && digits != std::string::npos &&
          digits > 0) {
        footer.exit_codes.emplace_back(trimmed.substr(0, digits), trim(trimmed.substr(digits)));
      } else if (!footer.exit_codes.empty()) {
        footer.exit_codes.back().second += " " + trimmed;
      }
    } else if (trimmed.empty()) {
      end_paragraph();
    } else {
      paragraph += (paragraph.empty() ? "" : " ") + trimmed;
    }
  }
  end_paragraph();
  return footer;
}

std::vector<const CLI::App*> subcommands_of(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* sub) { return !sub->get_name().empty(); });
}

/// The options a user gives: not --help, which every command has.
std::vector<const CLI::Option*> named_options(const CLI::App& app) {
  const CLI::Option* help = app.get_help_ptr();
  return app.get_options(
      [help](const CLI::Option* option) { return option->nonpositional() && option != help; });
}

std::vector<const CLI::Option*> positionals_of(const CLI::App& app) {
  return app.get_options([](const CLI::Option* option) { return option->get_positional(); });
}

std::vector<std::string> flags_of(const CLI::Option& option) {
  std::vector<std::string> flags;
  for (const auto& name : option.get_snames())
    flags.push_back("-" + name);
  for (const auto& name : option.get_lnames())
    flags.push_back("--" + name);
  return flags;
}

bool takes_value(const CLI::Option& option) {
  return option.get_expected_max() != 0;  // flags expect no value
}

bool is_vector(const CLI::Option& option) {
  return option.get_expected_max() >= CLI::detail::expected_max_vector_size;
}

/// What a positional is called in a synopsis: its type name (FILE, SERVICE, BODY), else its name.
std::string positional_label(const CLI::Option& option) {
  std::string label = option.get_type_name();
  if (label.empty()) label = option.get_name(true);
  std::transform(label.begin(), label.end(), label.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return label;
}

/// The words of the command that runs `app`: "retryloop topology apply".
std::string command_words(const CLI::App& app) {
  std::string words = app.get_name();
  for (const CLI::App* parent = app.get_parent(); parent != nullptr; parent = parent->get_parent())
    words = parent->get_name() + " " + words;
  return words;
}

// ---- roff ------------------------------------------------------------------------------------

/// Text for a roff text line: backslashes escaped, the hyphens of options (-t, --url) made minus
/// signs, which man renders as a hyphen-minus that can be copied into a shell, and a leading
/// control character neutralised.
std::string roff(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '-' ||
                            text[i - 1] == '(' || text[i - 1] == '`' || text[i - 1] == '[')) {
      out += "\\-";
    } else {
      out += c;
    }
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out.insert(0, "\\&");
  return out;
}

std::string bold(std::string_view text) {
  return "\\fB" + roff(text) + "\\fR";
}

std::string italic(std::string_view text) {
  return "\\fI" + roff(text) + "\\fR";
}

std::string sentence(std::string text) {
  if (!text.empty() && text.back() != '.' && text.back() != ':') text += '.';
  return text;
}

/// The synopsis of a command that runs: `retryloop topology apply [OPTIONS] FILE`.
std::string synopsis(const CLI::App& app) {
  std::string line = bold(command_words(app));
  if (!named_options(app).empty()) line += " [" + italic("OPTIONS") + "]";
  for (const CLI::Option* positional : positionals_of(app)) {
    std::string label =
        italic(positional_label(*positional)) + (is_vector(*positional) ? "..." : "");
    line += " " + (positional->get_required() ? label : "[" + label + "]");
  }
  if (!subcommands_of(app).empty()) line += " " + italic("SUBCOMMAND");
  return line;
}

void write_option(std::ostream& out, const CLI::Option& option, bool positional) {
  std::string heading;
  if (positional) {
    heading = italic(positional_label(option)) + (is_vector(option) ? "..." : "");
  } else {
    for (const auto& flag : flags_of(option))
      heading += (heading.empty() ? "" : ", ") + bold(flag);
    if (takes_value(option)) {
      if (!option.get_type_name().empty()) heading += " " + italic(option.get_type_name());
      if (is_vector(option)) heading += " ...";
    }
  }
  if (option.get_required() && !positional) heading += " (required)";
  out << ".TP\n" << heading << "\n" << roff(sentence(option.get_description())) << "\n";
  if (!option.get_envname().empty()) {
    out << "Taken from " << bold(option.get_envname()) << " when not given.\n";
  }
}

void write_exit_codes(std::ostream& out, const Footer& footer) {
  for (const auto& [code, meaning] : footer.exit_codes) {
    out << ".TP\n" << bold(code) << "\n" << roff(meaning) << "\n";
  }
}

void write_paragraphs(std::ostream& out, const std::vector<std::string>& paragraphs) {
  for (const auto& paragraph : paragraphs)
    out << ".PP\n" << roff(paragraph) << "\n";
}

/// One command that runs (topology apply, send): its description, arguments and options; its exit
/// codes too when they are not `shared_exit_codes`. The page's synopsis shows how it is called.
void write_command(std::ostream& out, const CLI::App& app, const Footer& shared_exit_codes) {
  const Footer footer = parse_footer(app.get_footer());
  out << roff(sentence(app.get_description())) << "\n";
  write_paragraphs(out, footer.paragraphs);
  const auto positionals = positionals_of(app);
  const auto options = named_options(app);
  if (!positionals.empty() || !options.empty()) out << ".PP\nArguments and options:\n.RS\n";
  for (const CLI::Option* option : positionals)
    write_option(out, *option, true);
  for (const CLI::Option* option : options)
    write_option(out, *option, false);
  if (!positionals.empty() || !options.empty()) out << ".RE\n";
  if (!footer.exit_codes.empty() && footer.exit_codes != shared_exit_codes.exit_codes) {
    out << ".PP\nExit codes of " << bold(command_words(app)) << ":\n.RS\n";
    write_exit_codes(out, footer);
    out << ".RE\n";
  }
}

std::string lowercase_first(std::string text) {
  if (!text.empty()) text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  return text;
}

std::string page_name(const CLI::App& group) {
  return "retryloop-" + group.get_name();
}

std::string title(const std::string& name, const std::string& version, const std::string& date) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return ".TH " + upper + " 1 " + date + " \"retryloop " + version + "\" \"User Commands\"\n";
}

/// Every environment variable an option falls back to, with the commands that read it.
std::map<std::string, std::pair<std::string, std::set<std::string>>> environment_of(
    const CLI::App& app) {
  std::map<std::string, std::pair<std::string, std::set<std::string>>> variables;
  std::vector<const CLI::App*> pending{&app};
  while (!pending.empty()) {
    const CLI::App* command = pending.back();
    pending.pop_back();
    for (const CLI::Option* option : command->get_options()) {
      if (option->get_envname().empty()) continue;
      auto& entry = variables[option->get_envname()];
      if (entry.first.empty()) entry.first = option->get_description();
      entry.second.insert(command_words(*command));
    }
    for (const CLI::App* sub : subcommands_of(*command))
      pending.push_back(sub);
  }
  return variables;
}

std::string see_also(const CLI::App& app, const std::string& except) {
  std::vector<std::string> pages{"retryloop"};
  for (const CLI::App* group : subcommands_of(app))
    pages.push_back(page_name(*group));
  std::string text;
  for (const std::string& page : pages) {
    if (page != except) text += (text.empty() ? "" : ",\n") + bold(page) + "(1)";
  }
  return text + "\n";
}

std::string program_name_and_summary(const CLI::App& app) {
  std::string summary = app.get_description();
  const std::string prefix = app.get_name() + ": ";
  if (summary.rfind(prefix, 0) == 0) summary.erase(0, prefix.size());
  if (!summary.empty() && summary.back() == '.') summary.pop_back();
  return summary;
}

std::string top_page(const CLI::App& app, const std::string& version, const std::string& date) {
  std::ostringstream out;
  const Footer footer = parse_footer(app.get_footer());
  out << title("retryloop", version, date);
  out << ".SH NAME\nretryloop \\- " << roff(program_name_and_summary(app)) << "\n";
  out << ".SH SYNOPSIS\n"
      << bold("retryloop") << " " << italic("COMMAND") << " [" << italic("SUBCOMMAND") << "] ["
      << italic("OPTIONS") << "] [" << italic("ARGUMENTS") << "]\n.br\n"
      << bold("retryloop") << " " << bold("--version") << "\n";
  out << ".SH DESCRIPTION\n";
  write_paragraphs(out, footer.paragraphs);
  out << ".PP\nThe commands, each described in a page of its own:\n";
  for (const CLI::App* group : subcommands_of(app)) {
    out << ".TP\n"
        << bold("retryloop " + group->get_name()) << "\n"
        << roff(sentence(group->get_description()));
    const auto subs = subcommands_of(*group);
    if (!subs.empty()) {
      out << " Subcommands:";
      for (size_t i = 0; i < subs.size(); ++i)
        out << (i == 0 ? " " : ", ") << bold(subs[i]->get_name());
      out << ".";
    }
    out << " See " << bold(page_name(*group)) << "(1).\n";
  }
  out << ".PP\nEvery command and subcommand prints its own help with " << bold("--help") << ".\n";
  out << ".SH OPTIONS\n";
  for (const CLI::Option* option : {app.get_help_ptr(), app.get_version_ptr()}) {
    if (option != nullptr) write_option(out, *option, false);
  }
  out << ".SH EXIT STATUS\n";
  write_exit_codes(out, footer);
  out << ".PP\nA command group's page lists the codes of its commands where they differ.\n";
  out << ".SH ENVIRONMENT\n";
  for (const auto& [name, use] : environment_of(app)) {
    out << ".TP\n" << bold(name) << "\n" << roff(sentence(use.first)) << " Read by";
    size_t i = 0;
    for (const auto& command : use.second)
      out << (i++ == 0 ? " " : ", ") << bold(command);
    out << ".\n";
  }
  out << ".SH SEE ALSO\n" << see_also(app, "retryloop");
  return out.str();
}

std::string group_page(const CLI::App& app, const CLI::App& group, const std::string& version,
                       const std::string& date) {
  std::ostringstream out;
  const std::string name = page_name(group);
  const Footer footer = parse_footer(group.get_footer());
  const auto subs = subcommands_of(group);
  out << title(name, version, date);
  out << ".SH NAME\n" << name << " \\- " << roff(lowercase_first(group.get_description())) << "\n";
  out << ".SH SYNOPSIS\n";
  if (subs.empty()) {
    out << synopsis(group) << "\n";
  } else {
    for (size_t i = 0; i < subs.size(); ++i)
      out << (i == 0 ? "" : ".br\n") << synopsis(*subs[i]) << "\n";
  }
  out << ".SH DESCRIPTION\n";
  if (subs.empty()) {
    write_command(out, group, footer);
  } else {
    out << roff(sentence(group.get_description())) << "\n";
    write_paragraphs(out, footer.paragraphs);
    out << ".SH COMMANDS\n";
    for (const CLI::App* sub : subs) {
      out << ".SS " << command_words(*sub) << "\n";
      write_command(out, *sub, footer);
    }
  }
  if (!footer.exit_codes.empty()) {
    out << ".SH EXIT STATUS\n";
    write_exit_codes(out, footer);
  }
  out << ".SH SEE ALSO\n" << see_also(app, name);
  return out.str();
}

// ---- bash ------------------------------------------------------------------------------------

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& word : words)
    text += (text.empty() ? "" : " ") + word;
  return text;
}

bool names_a_service(const CLI::Option& option) {
  const std::string type = option.get_type_name();
  const auto& long_names = option.get_lnames();
  return type == "SERVICE" || option.get_name(true) == "service" ||
         std::find(long_names.begin(), long_names.end(), "service") != long_names.end();
}

/// One case of _retryloop_spec: what the command at `path` accepts.
void write_spec(std::ostream& out, const CLI::App& app, const std::string& path) {
  std::vector<std::string> subs, flags, value_flags, file_flags, service_flags, positionals;
  for (const CLI::App* sub : subcommands_of(app))
    subs.push_back(sub->get_name());
  for (const CLI::Option* option :
       app.get_options([](const CLI::Option* o) { return o->nonpositional(); })) {
    for (const auto& flag : flags_of(*option)) {
      flags.push_back(flag);
      if (!takes_value(*option)) continue;
      value_flags.push_back(flag);
      if (option->get_type_name() == "FILE") file_flags.push_back(flag);
      if (names_a_service(*option)) service_flags.push_back(flag);
    }
  }
  for (const CLI::Option* option : positionals_of(app)) {
    positionals.push_back(option->get_type_name() == "FILE" || option->get_name(true) == "FILE"
                              ? "file"
                          : names_a_service(*option) ? "service"
                                                     : "-");
  }
  out << "  \"" << path << "\")\n"
      << "    subs=\"" << joined(subs) << "\" flags=\"" << joined(flags) << "\"\n"
      << "    value_flags=\"" << joined(value_flags) << "\" file_flags=\"" << joined(file_flags)
      << "\"\n"
      << "    service_flags=\"" << joined(service_flags) << "\" positionals=\""
      << joined(positionals) << "\" ;;\n";
  for (const CLI::App* sub : subcommands_of(app))
    write_spec(out, *sub, path.empty() ? sub->get_name() : path + " " + sub->get_name());
}

}  // namespace

std::vector<ManPage> man_pages(const CLI::App& app, const std::string& version,
                               const std::string& date) {
  std::vector<ManPage> pages{{"retryloop.1", top_page(app, version, date)}};
  for (const CLI::App* group : subcommands_of(app))
    pages.push_back({page_name(*group) + ".1", group_page(app, *group, version, date)});
  return pages;
}

std::string bash_completion(const CLI::App& app) {
  std::ostringstream out;
  out << R"bash(# bash completion for retryloop(1): command groups, subcommands and options, file names, and
# the services of the topology file on the command line (or in RETRYLOOP_TOPOLOGY).
# Generated from the command line's definition by retryloop_reference; do not edit.

# What the command at path $1 accepts: subcommands, flags, flags that take a value (of them, those
# whose value is a file or a service), and the kinds of its positional arguments.
_retryloop_spec() {
  subs= flags= value_flags= file_flags= service_flags= positionals=
  case $1 in
)bash";
  write_spec(out, app, "");
  out << R"bash(  esac
}

# The services of topology file $2, asked of the retryloop command $1.
_retryloop_services() {
  local file=${2/#\~/$HOME}
  [[ -n $file && -r $file ]] || return 0
  "$1" topology plan --json -- "$file" 2>/dev/null |
    sed -n '/^  "services": \[/,/^  \]/s/^    "\(.*\)",\{0,1\}$/\1/p'
}

_retryloop() {
  local cur prev words cword split
  _init_completion -s || return

  local subs flags value_flags file_flags service_flags positionals
  local path= topology=${RETRYLOOP_TOPOLOGY-} word i given=0 kinds
  _retryloop_spec ""
  for ((i = 1; i < cword; i++)); do
    word=${words[i]}
    if [[ " $value_flags " == *" $word "* ]]; then
      [[ " $file_flags " == *" $word "* && $word == @(-t|--topology) ]] && topology=${words[i + 1]}
      ((i++))
    elif [[ $word == --topology=* ]]; then
      topology=${word#*=}
    elif [[ $word == -* ]]; then
      :
    elif [[ " $subs " == *" $word "* ]]; then
      path=${path:+$path }$word
      _retryloop_spec "$path"
    else
      kinds=($positionals)
      [[ ${path%% *} == topology && ${kinds[given]-} == file ]] && topology=$word
      ((given++))
    fi
  done

  if [[ " $value_flags " == *" $prev "* ]]; then
    if [[ " $file_flags " == *" $prev "* ]]; then
      _filedir
    elif [[ " $service_flags " == *" $prev "* ]]; then
      COMPREPLY=($(compgen -W "$(_retryloop_services "${words[0]}" "$topology")" -- "$cur"))
    fi
    return
  fi
  $split && return
  if [[ $cur == -* || ( -z $subs && -z $positionals ) ]]; then
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    [[ ${COMPREPLY-} == *= ]] && compopt -o nospace
    return
  fi
  if [[ -n $subs ]]; then
    COMPREPLY=($(compgen -W "$subs" -- "$cur"))
    return
  fi
  kinds=($positionals)
  case ${kinds[given]-${kinds[-1]-}} in
    file) _filedir ;;
    service) COMPREPLY=($(compgen -W "$(_retryloop_services "${words[0]}" "$topology")" -- "$cur")) ;;
  esac
} &&
  complete -F _retryloop retryloop
)bash";
  return out.str();
}

}  // namespace retryloop::cli
