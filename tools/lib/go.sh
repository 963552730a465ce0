# Sourced by the scripts that build or fetch with Go (tools/*/build, tools/prometheus-operator/crds).
#   need_go WHO MESSAGE   puts Go on PATH, or exits naming WHO and MESSAGE (which Go is needed, for what)
# Go's official installer puts it in /usr/local/go/bin, which only interactive shells may have on PATH.
# The compiler and the linker this script's builds start run without their garbage collector (GOGC=off) until a
# process's heap reaches 3 GiB (GOMEMLIMIT): kube-apiserver, kubectl and etcd built from an empty build cache took
# 19 % less CPU time (user and system) so, and their largest process grew from 2280 to 2504 MiB
# (make benchmark-go-build, docs/benchmarks.md).
# A GOGC or GOMEMLIMIT set by the caller is kept. Only the builds get these: the programs built run with Go's own.
need_go() {
  local dir
  for dir in /usr/local/go/bin "$HOME/go/bin" /usr/lib/go/bin; do
    command -v go >/dev/null 2>&1 || { [[ -x "$dir/go" ]] && PATH="$dir:$PATH"; }
  done
  command -v go >/dev/null 2>&1 || {
    echo "$1: $2; install it from go.dev/dl" >&2
    exit 1
  }
  export GOGC="${GOGC:-off}" GOMEMLIMIT="${GOMEMLIMIT:-3GiB}"
}
