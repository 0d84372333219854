# Sourced by .ci/test, .ci/demo and .ci/run: one place that knows how the project venv is made.
# VENV defaults to .venv in the repo; the install is pinned by .ci/constraints.txt.
VENV="${BOS_VENV:-$PWD/.venv}"
# Another pin set and extra for a venv of its own (the Snowflake tests: .ci/constraints-snowflake.txt).
CONSTRAINTS="${BOS_CONSTRAINTS:-.ci/constraints.txt}"
EXTRAS="${BOS_EXTRAS:-test}"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.bos-installed" ] \
     || [ pyproject.toml -nt "$VENV/.bos-installed" ] || [ "$CONSTRAINTS" -nt "$VENV/.bos-installed" ]; then
    echo ">> creating virtualenv $VENV and installing airflow-provider-bos[$EXTRAS]" >&2
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
      || { echo "Python >= 3.11 is required (set PYTHON=...)" >&2; exit 1; }
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "pip>=24"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      -c "$CONSTRAINTS" -e ".[$EXTRAS]"
    touch "$VENV/.bos-installed"
  fi
}
