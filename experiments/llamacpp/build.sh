#!/usr/bin/env bash
# Build llama.cpp (the CPU peer of the benchmark) from the llama-cpp-python sdist, which ships its full source.
# Usage: experiments/llamacpp/build.sh [DIR]   (default: llamacpp/ in oospec's cache, $OOSPEC_HOME or ~/.cache/oospec)
# Produces DIR/build/bin/llama-server and llama-bench (where `oospec bench llamacpp` looks by default). The ISA
# flags are chosen from /proc/cpuinfo: GGML_NATIVE crashed at the first matmul on an AMX Xeon, so the build names
# AVX2 / AVX-512 explicitly and leaves AMX off. ISA=avx2 builds the AVX2 peer alone into DIR/build-avx2 (what an
# AVX2-only CPU runs: the peer of `OOSPEC_KERNEL_ISA=avx2` forced on a bigger CPU).
set -euo pipefail
VERSION=0.3.36
DIR=${1:-${OOSPEC_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/oospec}/llamacpp}  # as oospec_home() decides
PY=${PYTHON:-python3}
mkdir -p "$DIR"
cd "$DIR"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  "$PY" -m pip download --no-deps --no-binary :all: -d . "llama-cpp-python==$VERSION"
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
has() { [ "${ISA:-}" != avx2 ] && grep -qw "$1" /proc/cpuinfo; }
BUILD="$DIR/build${ISA:+-$ISA}"
FLAGS=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
       -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
if has avx512f; then FLAGS+=(-DGGML_AVX512=ON); fi
if has avx512_vbmi; then FLAGS+=(-DGGML_AVX512_VBMI=ON); fi
if has avx512_vnni; then FLAGS+=(-DGGML_AVX512_VNNI=ON); fi
if has avx512_bf16; then FLAGS+=(-DGGML_AVX512_BF16=ON); fi
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF "${FLAGS[@]}"
cmake --build "$BUILD" -j "$(nproc)" --target llama-server llama-bench
echo "built: $BUILD/bin/llama-server $BUILD/bin/llama-bench (flags: ${FLAGS[*]})"
