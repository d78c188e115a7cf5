#!/usr/bin/env bash
# JupyterLab on the project (`make lab`): the repository is the lab's root, the file browser opens in
# notebooks/, and the `driftscope (.venv)` kernel is found because it is installed into the venv
# (setup: `ipykernel install --sys-prefix`), so no JUPYTER_PATH is needed. Extra arguments go to
# `jupyter lab` (e.g. --no-browser --port 8890).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
ROOT_FLAG=()
if [ "$(id -u)" = 0 ]; then ROOT_FLAG=(--allow-root); fi  # containers and CI run as root
exec "$ROOT/.venv/bin/jupyter" lab \
    --ServerApp.root_dir="$ROOT" \
    --FileContentsManager.preferred_dir=notebooks \
    --MultiKernelManager.default_kernel_name=driftscope \
    "${ROOT_FLAG[@]}" "$@"
