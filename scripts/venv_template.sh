# Sourced by setup.sh: a venv kept as a template in the cache and linked into a fresh
# checkout instead of installed again (pip and compileall take 35 s there, linking 1 s).
#
# Hard links, so no copy. pip and Python replace a file rather than write into it (a new
# .pyc, an upgrade, an uninstall), so a change to one venv leaves the others as they were.
# The console scripts and pyvenv.cfg name their venv by path: those few are rewritten, and
# sed -i writes them anew. Python fixes up the paths compiled into the .pyc files itself.
# Hard links need one filesystem: where cp -al fails, setup.sh installs as before.

# venv_link TEMPLATE VENV: makes VENV (absent) of TEMPLATE's files; fails, leaving nothing,
# when TEMPLATE is not a complete template or cannot be linked.
venv_link() {
  [ -f "$1/.tfsift-stack" ] && venv_copy "$1" "$2" || return 1
  touch "$1"  # used now: see venv_keep
}

# venv_keep VENV TEMPLATE: keeps VENV as TEMPLATE (absent), then removes all templates beside
# it but the newest other one (a second checkout on another lock, say).
venv_keep() {
  [ ! -e "$2" ] || return 1
  mkdir -p "$(dirname "$2")"
  venv_copy "$1" "$2" || return 1
  touch "$2"
  # shellcheck disable=SC2012  # the names are hex digests
  ls -1td "$(dirname "$2")"/*/ | tail -n +3 | xargs -r -d '\n' rm -rf
}

# venv_copy FROM TO: TO (absent) made of hard links to venv FROM's files, the files that
# name FROM rewritten, and renamed into place whole; fails, leaving nothing, otherwise.
venv_copy() {
  local from="$1" to="$2" tmp="$2.copy.$$"
  rm -rf "$tmp"
  if cp -al "$from" "$tmp" 2>/dev/null && venv_repath "$tmp" "$from" "$to" \
      && mv -T "$tmp" "$to" 2>/dev/null; then
    return 0
  fi
  rm -rf "$tmp"
  return 1
}

# venv_repath DIR FROM TO: rewrites the path FROM to TO in the files of venv DIR that name it.
venv_repath() {
  local dir="$1" from="$2" to="$3" f
  for f in "$dir"/bin/* "$dir/pyvenv.cfg"; do
    if [ -f "$f" ] && [ ! -L "$f" ] && grep -qIF -- "$from" "$f"; then
      sed -i "s|$from|$to|g" "$f" || return 1
    fi
  done
}
