#!/usr/bin/env bash
# Idempotent set-up: .venv with pinned packages, the `driftscope` command, the notebook kernel, fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

STAMP="$VENV/.driftscope-installed"
WANT=$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "[setup] installing pinned packages into $VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # torch first and alone: `torch==2.13.0` is the CPU wheel on this machine's disk; any other
    # torch request (a range, or one pulled in by another package) would fetch a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install --quiet torch==2.13.0
    "$VENV/bin/python" -m pip install --quiet -r requirements.txt -c constraints.txt
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
        || "$VENV/bin/python" -m pip install --quiet --no-deps -e .
    echo "$WANT" > "$STAMP"
fi

# Debian packages: headless Chromium and its driver (the reviewers'-page browser test) and OpenBLAS,
# which driftscope loads for MLX's CPU matmuls instead of the wheel's reference BLAS (~50x faster).
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || [ ! -e "$OPENBLAS" ]; then
    PACKAGES="chromium chromium-driver libopenblas0-pthread"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "[setup] installing $PACKAGES (apt)"
        apt-get install -y --no-install-recommends $PACKAGES >/dev/null 2>&1 \
            || { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends $PACKAGES >/dev/null; }
    else
        echo "[setup] warning: $PACKAGES missing and apt-get is not usable here (browser test fails, MLX stays slow)"
    fi
fi

# The package byte-compiled, as pip compiles a regular (not editable) install: where PYTHONDONTWRITEBYTECODE is
# set, every `driftscope` process, render process and notebook kernel would otherwise compile it from source
# again (only what changed is compiled; an edited module is recompiled when imported, as always).
"$VENV/bin/python" -m compileall -q lib >/dev/null

# The notebook kernel papermill runs (inside the venv, so it sees the same packages). ipykernel stages the spec in
# a temporary folder and leaves that folder's parent behind: it goes to one of ours, removed after.
staging="$(mktemp -d)"
TMPDIR="$staging" "$VENV/bin/python" -m ipykernel install --sys-prefix --name driftscope --display-name "driftscope (.venv)" >/dev/null
rm -rf "$staging"

# Fixtures: every script is deterministic and skips work that is already done.
"$VENV/bin/python" fixtures/make_shapes.py >/dev/null
"$VENV/bin/python" fixtures/make_screen_set.py >/dev/null  # the screen set: fixtures/images/screen/
"$VENV/bin/python" fixtures/make_videos.py >/dev/null  # four frames as a GIF and as a folder of PNGs
"$VENV/bin/python" fixtures/make_tiny_qwen25vl.py
"$VENV/bin/python" fixtures/make_tiny_qwen25vl_deep.py
"$VENV/bin/python" fixtures/make_tiny_molmo2.py  # the hub layout (the family's tiny fixture) and the native one
"$VENV/bin/python" fixtures/make_family_tinies.py  # every family's tiny fixture (Qwen3-VL's, Qwen3-VL-MoE's, ...)
"$VENV/bin/python" fixtures/make_generic_tinies.py >/dev/null  # the generic family's tester-config checkpoints
"$VENV/bin/python" fixtures/make_tiny_q4.py  # each family's tiny fixture in 4 bits
"$VENV/bin/python" fixtures/make_tiny_qwen25vl_wide.py  # parameters/demo_q4.yaml
"$VENV/bin/python" fixtures/make_tester_configs.py  # settings of transformers' and mlx-vlm's model testers
echo "[setup] ready: $VENV/bin/driftscope"
