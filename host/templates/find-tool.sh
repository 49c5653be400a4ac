# A tool is taken from its variable, else from where lsgd-host's scripts/setup-guests.sh put it
# (under ~/.cache/lsgd-host: the versions lsgd-host is tested with), else from PATH.
lsgd_cache="${LSGD_CACHE_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/lsgd-host}"
find_tool() {  # VARIABLE NAME INSTALLED-PATH
  if [ -n "${!1:-}" ]; then echo "${!1}"; return; fi
  if [ -x "$3" ]; then echo "$3"; return; fi
  if command -v "$2" >/dev/null; then command -v "$2"; return; fi
  echo "build.sh: $2 not found: set $1, put it on PATH, or run lsgd-host's scripts/setup-guests.sh (it installs $3)" >&2
  exit 1
}
