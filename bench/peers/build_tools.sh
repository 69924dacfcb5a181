# Sourced by the peer scripts. Uses the caller's `say` and `die`, and prints nothing on standard
# output (llama_server.sh's standard output is the binary's path).
#
# ensure_build_tools: installs cmake and a C/C++ toolchain with apt-get when missing.
ensure_build_tools() {
  local need_apt=() SUDO=""
  say "checking for cmake, c++ and make"
  command -v cmake >/dev/null || need_apt+=(cmake)
  { command -v c++ >/dev/null && command -v make >/dev/null; } || need_apt+=(build-essential)
  [ ${#need_apt[@]} -gt 0 ] || return 0
  command -v apt-get >/dev/null ||
    die "${need_apt[*]} missing and no apt-get to install them: install cmake, make and a C++ compiler"
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "${need_apt[*]} missing: run as root or install sudo (apt-get needs it)"
    SUDO="sudo"
  fi
  say "installing ${need_apt[*]} with apt-get"
  $SUDO apt-get update -qq >/dev/null || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null ||
    die "apt-get install ${need_apt[*]} failed"
  command -v cmake >/dev/null || die "cmake still missing after apt-get install"
  command -v c++ >/dev/null || die "c++ still missing after apt-get install"
  command -v make >/dev/null || die "make still missing after apt-get install"
}

# ensure_llama_src PEERS VERSION: leaves llama-cpp-python VERSION's sdist unpacked in
# PEERS/llama_cpp_python-VERSION (its vendor/llama.cpp is llama.cpp's source), downloading it
# with pip when missing; dies with a message on any failure.
ensure_llama_src() {
  local peers="$1" version="$2" src sdists sdist tops
  src="$peers/llama_cpp_python-$version"
  if [ -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    say "llama.cpp source present: $src"
    return 0
  fi
  mkdir -p "$peers" || die "cannot create $peers"
  shopt -s nullglob
  sdists=("$peers"/llama[-_]cpp[-_]python-"$version".tar.gz)
  shopt -u nullglob
  if [ ${#sdists[@]} -eq 0 ]; then
    say "downloading the llama-cpp-python $version sdist with pip"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$version" -d "$peers" >&2 ||
      die "pip download llama-cpp-python==$version failed"
    shopt -s nullglob
    sdists=("$peers"/llama[-_]cpp[-_]python-"$version".tar.gz)
    shopt -u nullglob
  fi
  [ ${#sdists[@]} -gt 0 ] || die "pip download left no llama-cpp-python $version sdist (*.tar.gz) in $peers"
  sdist="${sdists[0]}"
  say "unpacking $(basename "$sdist")"
  rm -rf "$src.tmp" && mkdir -p "$src.tmp" || die "cannot create $src.tmp"
  tar -xzf "$sdist" -C "$src.tmp" || die "cannot unpack $sdist"
  shopt -s nullglob
  tops=("$src.tmp"/*/)
  shopt -u nullglob
  [ ${#tops[@]} -eq 1 ] || die "$sdist: expected one top-level folder, found ${#tops[@]}"
  rm -rf "$src" && mv "${tops[0]%/}" "$src" && rm -rf "$src.tmp" || die "cannot move the sources to $src"
  [ -f "$src/vendor/llama.cpp/CMakeLists.txt" ] || die "$src/vendor/llama.cpp: not llama.cpp's source"
}
