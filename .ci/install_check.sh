#!/usr/bin/env bash
# Install check: build the wheel and sdist, install the WHEEL the way the README tells users (torch first,
# then the [all] extra, no dev extra) into a fresh virtual environment, and index + search a few files into
# LanceDB, FAISS and (with --engine ray) LanceDB again. A missing module, package file or runtime dependency
# fails here. Other checks of the installed package can be added at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}
started=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "install check: building the sdist and wheel"
.venv/bin/python -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/isotrope-*.whl)
ls "$work"/dist/isotrope-*.tar.gz >/dev/null

# every tracked file of the packages (modules and package data) must be in the wheel
.venv/bin/python - "$wheel" <<'PY'
import subprocess, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
roots = {"src/isotrope/": "isotrope/", "connectors/": "isotrope/connectors/"}
tracked = subprocess.run(["git", "ls-files", *roots], capture_output=True, text=True, check=True).stdout.split()
missing = [path for path in tracked
           for root, target in roots.items()
           if path.startswith(root) and target + path[len(root):] not in names]
if missing:
    sys.exit("install check: files missing from the wheel: " + ", ".join(missing))
print(f"install check: wheel holds all {len(tracked)} package files")
PY

echo "install check: fresh virtual environment, torch==2.13.0 then ${wheel##*/}[all]"
"$python" -m venv "$work/venv"
bin=$work/venv/bin
quiet_pip() { { "$bin/python" -m pip install -q "$@" 2>&1; } | { grep -v "is ignored: it is neither" || true; }; }
quiet_pip torch==2.13.0
quiet_pip "$wheel[all]"

cd "$work"  # away from the source tree: only the installed package can be imported
mkdir docs
printf 'The cat sat on the mat and purred at the birds outside.\n' > docs/cats.txt
printf '# Rockets\n\nA rocket engine burns fuel and oxygen to lift a payload into orbit.\n' > docs/rockets.md
printf 'Bread is baked from flour, water, salt and yeast in a hot oven.\n' > docs/bread.rst
model=static:all-MiniLM-L6-v2
for store in "lancedb:$work/lance" "faiss:$work/faiss"; do
    "$bin/isotrope" index docs --store "$store" --model "$model"
    "$bin/isotrope" search "$store" "space launch into orbit" -k 1 | tee "$work/hits.txt"
    grep -q "rockets.md" "$work/hits.txt" || { echo "install check: $store did not find rockets.md"; exit 1; }
done
"$bin/isotrope" search "faiss:$work/faiss" "oxygen fuel" -k 1 --mode lexical | grep -q "rockets.md" \
    || { echo "install check: the FAISS store's keyword search did not find rockets.md"; exit 1; }
# the FAISS store's keyword top k on a large store runs sparse_dot_topn's compiled core
"$bin/python" -c "from sparse_dot_topn import _core; assert hasattr(_core, 'sp_matmul_topn')" \
    || { echo "install check: sparse_dot_topn's core is missing"; exit 1; }
"$bin/isotrope" index docs --store "lancedb:$work/lance-ray" --model "$model" --engine ray --num-actors 1
"$bin/isotrope" search "lancedb:$work/lance-ray" "baking in an oven" -k 1 | grep -q "bread.rst" \
    || { echo "install check: the Ray-built store did not find bread.rst"; exit 1; }
# the ONNX Runtime backend from the [all] install: export, int8 quantisation, and a store of int8 vectors
export ISOTROPE_CACHE_DIR=$work/cache
"$bin/isotrope" index docs --store "lancedb:$work/lance-int8" --model all-MiniLM-L6-v2 --backend onnx-int8
"$bin/isotrope" search "lancedb:$work/lance-int8" "space launch into orbit" -k 1 --mode hybrid | grep -q "rockets.md" \
    || { echo "install check: the onnx-int8 store did not find rockets.md"; exit 1; }
echo "install check: passed in $((SECONDS - started)) s"
