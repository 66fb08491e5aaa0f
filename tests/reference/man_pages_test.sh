#!/usr/bin/env bash
# The man pages the build writes: each renders without a groff warning and has a NAME line that
# whatis can read (lexgrog), there is one for every command group `retryloop --help` lists, and
# each page has every subcommand and every option that the subcommand's --help shows.
#
#   man_pages_test.sh MAN_DIR RETRYLOOP
set -uo pipefail

dir=${1:?directory of the .1 files} retryloop=${2:?retryloop command}
failures=0
fail() { echo "FAILED: $*"; ((failures++)); }

subcommands() {  # the names under "Subcommands:" in the help of `retryloop ARGS...`
  "$retryloop" "$@" --help | awk '/^Subcommands:/ { on = 1; next } /^$/ { on = 0 } on { print $1 }'
}
options() {  # the long options in the help of `retryloop ARGS...`, but --help
  "$retryloop" "$@" --help | awk '/^Options:/ { on = 1; next } /^$/ { on = 0 } on' |
    grep -o -- '--[a-z][a-z-]*' | grep -vx -- '--help' | sort -u
}
rendered() {  # the page as man shows it, as plain text
  MANWIDTH=200 LC_ALL=C.UTF-8 man -l -P cat "$1" 2>/dev/null | sed 's/.\x08//g'
}

for page in "$dir"/*.1; do
  warnings=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l -P cat "$page" 2>&1 >/dev/null)
  [[ -z $warnings ]] || fail "$(basename "$page"): groff warns: $warnings"
  lexgrog "$page" >/dev/null 2>&1 || fail "$(basename "$page"): lexgrog finds no NAME line"
done

groups=$(subcommands)
[[ -n $groups ]] || fail "retryloop --help lists no command group"
text=$(rendered "$dir/retryloop.1")
for group in $groups; do
  page=$dir/retryloop-$group.1
  [[ -f $page ]] || { fail "no page for retryloop $group"; continue; }
  grep -q "retryloop-$group(1)" <<<"$text" || fail "retryloop(1) does not point to retryloop-$group(1)"
  group_text=$(rendered "$page")
  subs=$(subcommands "$group")
  for sub in ${subs:-""}; do
    words="retryloop $group${sub:+ $sub}"
    if [[ -n $sub ]] && ! grep -q "^   $words\$" <<<"$group_text"; then
      fail "retryloop-$group(1) has no section for $words"
    fi
    for option in $(options $group $sub); do
      grep -q -- "$option" <<<"$group_text" || fail "retryloop-$group(1) lacks $option of $words"
    done
  done
  echo "checked retryloop-$group(1): ${subs:-one command}" | paste -sd ' '
done

((failures == 0)) && echo "man pages: every check passed" || echo "man pages: $failures failed"
((failures == 0))
