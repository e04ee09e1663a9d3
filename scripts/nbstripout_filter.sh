#!/bin/sh
# The notebooks' git filter and diff (`make venv` points git at this script):
#   nbstripout_filter.sh VENV clean            stdin -> stdout, the notebook without outputs (git add, status)
#   nbstripout_filter.sh VENV textconv FILE    FILE's text without outputs (git diff)
# nbstripout runs from VENV when it is there. When VENV is gone (`make clean-venv`, or deleted by hand) the
# notebook passes through unchanged with one line saying so, so `git diff`, `status` and `add` keep working
# instead of failing on a missing interpreter; `make venv` brings the filter back.
venv=$1
mode=$2
if [ -x "$venv/bin/nbstripout" ]; then
    case $mode in
        clean) exec "$venv/bin/python" -m nbstripout --keep-id --extra-keys metadata.language_info ;;
        textconv) exec "$venv/bin/python" -m nbstripout -t "$3" ;;
    esac
else
    echo "notebook filter: $venv has no nbstripout, the notebook is taken as it is (make venv restores the filter)" >&2
    case $mode in
        clean) exec cat ;;
        textconv) exec cat "$3" ;;
    esac
fi
echo "nbstripout_filter.sh: mode must be clean or textconv, got '$mode'" >&2
exit 2
