#!/usr/bin/env bash
# Torch-free check: a store written with a folded encoder is searched from a fresh virtual environment that
# holds the wheel with [faiss,lancedb] only: no torch, no transformers. The stores are built beforehand in the
# full dev environment (.venv): static:all-MiniLM-L6-v2 + whiten-partial fitted on the repository's docs,
# folded to one float16 table. Also checks that the torch-free install can export the folded encoder, and that
# asking it for a transformer fails in one line naming the extra. Prints the time of each stage.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}
started=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
stage() { echo "torch-free check: $1 ($((SECONDS - started)) s)"; }

stage "building folded-encoder stores in the dev environment"
.venv/bin/python - "$work" <<'PY'
import sys
from pathlib import Path
from isotrope.corpus import iter_texts
from isotrope.encoder import ShapedEncoder
from isotrope.fold import fold_encoder
from isotrope.ingest.pipeline import index_documents

work = Path(sys.argv[1])
texts = [text for path in Path("docs").glob("*.md") for text in iter_texts(path) if len(text) > 20]
encoder = ShapedEncoder.create("static:all-MiniLM-L6-v2", shape="whiten-partial").fit(texts)
folded = fold_encoder(encoder, dtype="float16")
folded.save(work / "encoder")
for store in (f"faiss:{work / 'faiss'}", f"lancedb:{work / 'lance'}"):
    index_documents(Path("docs"), store, encoder=folded, show_progress=False)
PY
for store in faiss lance; do
    kind=$([ "$store" = lance ] && echo lancedb || echo faiss)
    .venv/bin/isotrope search "$kind:$work/$store" "how fast is a folded encoder" -k 3 --json > "$work/$store.dev.json"
done

stage "building the wheel"
.venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$repo" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/isotrope-*.whl)

stage "fresh virtual environment with ${wheel##*/}[faiss,lancedb] (no torch)"
"$python" -m venv "$work/venv"
bin=$work/venv/bin
{ "$bin/python" -m pip install -q "$wheel[faiss,lancedb]" 2>&1; } | { grep -v "is ignored: it is neither" || true; }
if "$bin/python" -c "import torch" 2>/dev/null || "$bin/python" -c "import transformers" 2>/dev/null; then
    echo "torch-free check: torch or transformers was installed by isotrope[faiss,lancedb]"; exit 1
fi
du -sh "$work/venv" | sed 's/^/torch-free check: venv size /'

stage "searching from the torch-free environment"
cd "$work"  # away from the source tree: only the installed package can be imported
for store in faiss lance; do
    kind=$([ "$store" = lance ] && echo lancedb || echo faiss)
    /usr/bin/time -f "torch-free check: cold search $kind %e s, peak RSS %M KB" \
        "$bin/isotrope" search "$kind:$work/$store" "how fast is a folded encoder" -k 3 --json > "$work/$store.free.json"
    "$bin/python" - "$work/$store.dev.json" "$work/$store.free.json" <<'PY'
import json, sys
dev, free = (json.load(open(path)) for path in sys.argv[1:])
assert [h["id"] for h in dev] == [h["id"] for h in free], (dev, free)
assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(dev, free))
print(f"torch-free check: same {len(free)} hits as the dev environment")
PY
done
"$bin/isotrope" export "$work/encoder" --format model2vec --out "$work/m2v" >/dev/null
test -f "$work/m2v/model.safetensors"
if "$bin/isotrope" fit "$repo/README.md" --out "$work/x" --model static:all-MiniLM-L6-v2 2> "$work/err.txt"; then
    echo "torch-free check: a static:<transformer> table was fitted without torch"; exit 1
fi
grep -q "pip install 'isotrope\[transformers\]'" "$work/err.txt" && [ "$(wc -l < "$work/err.txt")" -eq 1 ] \
    || { echo "torch-free check: expected one error line naming the extra, got:"; cat "$work/err.txt"; exit 1; }
stage "passed"
