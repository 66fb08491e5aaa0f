#!/usr/bin/env bash
# The bash completion of retryloop, run as bash runs it: each case sets COMP_WORDS and COMP_LINE
# as for a Tab at the end of a command line, calls the completion function and compares what it
# offers. Needs bash-completion; a topology file with the services "orders" and "audit".
#
#   completion_test.sh COMPLETION_FILE RETRYLOOP TOPOLOGY_FILE
set -uo pipefail

completion=${1:?completion file} retryloop=${2:?retryloop command} topology=${3:?topology file}
source /usr/share/bash-completion/bash_completion || { echo "no bash-completion" >&2; exit 1; }
source "$completion"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
ln -s "$(realpath "$retryloop")" "$bin/retryloop"
PATH=$bin:$PATH

failures=0
offers() {  # offers LINE EXPECTED: what Tab offers at the end of LINE, sorted, space-separated
  local line=$1 expected=$2 got
  read -r -a COMP_WORDS <<<"$line"
  [[ $line == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1)) COMP_LINE=$line COMP_POINT=${#line} COMPREPLY=()
  _retryloop retryloop
  got=$(printf '%s\n' "${COMPREPLY[@]}" | sed '/^$/d' | sort | paste -sd ' ')
  if [[ $got == "$expected" ]]; then
    echo "ok: [$line] -> $got"
  else
    echo "FAILED: [$line] offers [$got], expected [$expected]"
    ((failures++))
  fi
}

offers "retryloop " "dispatch outbox parking schedule send service topology"
offers "retryloop to" "topology"
offers "retryloop topology " "apply delete export migrate plan transfer verify"
offers "retryloop topology apply --s" "--service"
offers "retryloop --v" "--version"
offers "retryloop topology apply $topology --service " "audit orders"
offers "retryloop topology verify --service o" ""  # no file yet: no services to offer
offers "retryloop parking list -t $topology " "audit orders"
offers "retryloop parking replay --topology=$topology o" "orders"
offers "retryloop service pause --topology $topology a" "audit"
RETRYLOOP_TOPOLOGY=$topology offers "retryloop service status " "audit orders"
offers "retryloop outbox relay --no" "--no-notify"
offers "retryloop send --lines --q" "--queue"
offers "retryloop dispatch -t $topology " "audit orders"
offers "retryloop dispatch --http-v" "--http-version"
dir=$(dirname "$topology")
offers "retryloop topology plan $dir/$(basename "$topology" | cut -c1-3)" "$topology"

((failures == 0)) && echo "completion: every case passed" || echo "completion: $failures failed"
((failures == 0))
