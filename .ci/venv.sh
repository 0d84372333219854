# Sourced by .ci/test, .ci/demo, .ci/lint, .ci/docs, .ci/package and .ci/run: one place that knows how
# the project venv is made. VENV defaults to .venv in the repo; the install is pinned by .ci/constraints.txt.
VENV="${BOS_VENV:-$PWD/.venv}"
# Another pin set and extra for a venv of its own (the Snowflake tests: .ci/constraints-snowflake.txt;
# the oldest supported Airflow: .ci/constraints-airflow-3.1.txt).
CONSTRAINTS="${BOS_CONSTRAINTS:-.ci/constraints.txt}"
EXTRAS="${BOS_EXTRAS:-test}"
PYTHON="${PYTHON:-python3}"

# pip_install <python> <pip install arguments>: `pip install` into that interpreter's environment.
# With BOS_WHEELHOUSE set (.ci/run sets it, to a folder it empties first), every distribution is
# downloaded once into that folder and each install takes what it needs from there (--no-index), so
# the steps that build a venv of their own (the Snowflake tests, the docs, the package check) do not
# download Airflow again. pip's own HTTP cache is not relied on: the registry here answers no-store.
pip_install() {
  local python=$1; shift
  local pip=("$python" -m pip --disable-pip-version-check)
  if [ -z "${BOS_WHEELHOUSE:-}" ]; then
    "${pip[@]}" install --quiet "$@"
    return
  fi
  # `pip download` takes no install options: the editable project is named by its path there.
  local download=() arg
  for arg in "$@"; do
    case "$arg" in -e|--editable|-U|--upgrade|--no-compile) ;; *) download+=("$arg") ;; esac
  done
  wheelhouse_add "$python" "${download[@]}"
  "${pip[@]}" install --quiet --no-index --find-links "$BOS_WHEELHOUSE" "$@"
}

# wheelhouse_add <python> <pip download arguments>: into BOS_WHEELHOUSE, what is not there yet (no-op
# without one). Also for what pip installs without saying: a build's isolated environment (setuptools).
wheelhouse_add() {
  [ -n "${BOS_WHEELHOUSE:-}" ] || return 0
  local python=$1; shift
  mkdir -p "$BOS_WHEELHOUSE"
  # .ci/run builds venvs side by side: their downloads take turns, so no pip installs a wheel that
  # another is still writing.
  local lock=()
  command -v flock > /dev/null && lock=(flock "$BOS_WHEELHOUSE/.lock")
  "${lock[@]}" "$python" -m pip --disable-pip-version-check download --quiet --dest "$BOS_WHEELHOUSE" \
    --find-links "$BOS_WHEELHOUSE" "$@"
}

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.bos-installed" ] \
     || [ pyproject.toml -nt "$VENV/.bos-installed" ] || [ "$CONSTRAINTS" -nt "$VENV/.bos-installed" ]; then
    echo ">> creating virtualenv $VENV and installing airflow-provider-bos[$EXTRAS]" >&2
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || { echo "Python >= 3.11 is required (set PYTHON=...)" >&2; exit 1; }
    "$PYTHON" -m venv "$VENV"
    pip_install "$VENV/bin/python" --upgrade "pip>=24"
    # setuptools and wheel: the editable build's isolated environment.
    wheelhouse_add "$VENV/bin/python" -c "$CONSTRAINTS" setuptools wheel
    pip_install "$VENV/bin/python" -c "$CONSTRAINTS" -e ".[$EXTRAS]"
    touch "$VENV/.bos-installed"
  fi
}
