# Sourced by the peer scripts: installs cmake and a C/C++ toolchain with apt-get when missing.
# Uses the caller's `say` for progress.
ensure_build_tools() {
  local need_apt=() SUDO=""
  command -v cmake >/dev/null || need_apt+=(cmake)
  { command -v c++ >/dev/null && command -v make >/dev/null; } || need_apt+=(build-essential)
  [ ${#need_apt[@]} -gt 0 ] || return 0
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  say "installing ${need_apt[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
}
