# Sourced by tools/test and tools/molecule: runs a command as a named stage and records its wall
# time and outcome, one line "start<TAB>seconds<TAB>pass|fail<TAB>stage" in $SCV_GPU_STAGE_LOG
# when that is set. stage_table prints the recorded stages as a table, in the order they started.

stage() {
  local name=$1 start status=0
  shift
  start=$(date +%s%N)
  "$@" || status=$?
  if [[ -n "${SCV_GPU_STAGE_LOG:-}" ]]; then
    printf '%s\t%d\t%s\t%s\n' "$start" $((($(date +%s%N) - start + 500000000) / 1000000000)) \
      "$([[ $status -eq 0 ]] && echo pass || echo fail)" "$name" >>"$SCV_GPU_STAGE_LOG"
  fi
  return "$status"
}

stage_table() {
  printf '%-40s %8s  %s\n' stage seconds result
  sort -n "$1" | while IFS=$'\t' read -r _start seconds result name; do
    printf '%-40s %8s  %s\n' "$name" "$seconds" "$result"
  done
}
