#!/usr/bin/env bash
# llama.cpp's llama-bench (the peer subset in .peers/llamacpp) built on this CPU box for the
# device's H100/H200 (sm_90), so a device call carries it in `.peers/llama-bin.tar.xz` instead of
# spending ~6 minutes of GPU time building it (bench/offload_peer_device.sh uses it if there).
# Needs the CUDA 13 toolkit here (nvcc); cuBLAS comes from its pip wheel (linked, not carried:
# the device's torch ships libcublas.so.13) and the driver library from a stub (the device has
# the real one). The CPU backend is built in every variant (`GGML_CPU_ALL_VARIANTS`), loaded by
# what the device's CPU has, as `GGML_NATIVE=ON` would build there. ~1-2 hours on 2 cores.
#   bash scripts/llama_prebuilt.sh [WORK_DIR]   # then: ls -la .peers/llama-bin.tar.xz
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/work/llbuild}
toolkit=${CUDA_HOME:-/usr/local/cuda-13.0}
mkdir -p "$work" && cd "$work"
[ -d cublas ] || { "$repo/.venv/bin/python" -m pip download -q --no-deps -d wheels "nvidia-cublas>=13,<14"
  mkdir cublas && (cd cublas && unzip -q ../wheels/nvidia_cublas-*.whl); }
if [ ! -d cuda ]; then  # the toolkit with cuBLAS and a libcuda stub beside it
  mkdir -p cuda/include cuda/lib64/stubs cuda-stubs
  for d in bin nvvm targets lib; do ln -s "$toolkit/$d" cuda/$d; done
  ln -s "$toolkit"/include/* cuda/include/ && ln -s "$toolkit"/lib64/* cuda/lib64/
  ln -sf "$work"/cublas/nvidia/cu13/include/* cuda/include/
  for f in "$work"/cublas/nvidia/cu13/lib/*.so.13; do
    ln -sf "$f" cuda/lib64/ && ln -sf "$f" "cuda/lib64/$(basename "${f%.13}")"
  done
  for s in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree \
      cuMemAddressReserve cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease \
      cuMemSetAccess cuMemUnmap; do echo "int $s(void){return 999;}"; done > cuda-stubs/stub.c
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o cuda-stubs/libcuda.so cuda-stubs/stub.c
  ln -s "$work/cuda-stubs/libcuda.so" cuda/lib64/stubs/libcuda.so
fi
mkdir -p src
[ -d src/llama.cpp-0c1e57098 ] || tar xzf "$repo/.peers/llamacpp/llcpp-subset.tar.gz" -C src
cd src/llama.cpp-0c1e57098
export PATH=$work/cuda/bin:$PATH
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc" -DCUDAToolkit_ROOT="$work/cuda" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
  -DGGML_CPU_ALL_VARIANTS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT=0c1e57098 -DLLAMA_BUILD_NUMBER=0 \
  -DCMAKE_BUILD_RPATH='$ORIGIN' > "$work/cmake.log"
cmake --build build -j "$(nproc)" --target llama-bench ggml-cuda $(ninja -C build -t targets all \
  | grep -o '^ggml-cpu-[a-z0-9_]*:' | tr -d : | sort -u) > "$work/build.log"
# llama-bench, its libraries, the CUDA backend and the CPU variants an x86 server may load,
# stripped and packed (~43 MB: a call carries at most 64 MiB, the wheels included)
out=$(mktemp -d)/llama-bin
mkdir -p "$out"
(cd build/bin && cp -L llama-bench libllama-bench-impl.so libllama-common.so.0 libllama.so.0 \
  libggml.so.0 libggml-base.so.0 libggml-cuda.so libggml-cpu-{x64,haswell,skylakex,icelake}.so \
  libggml-cpu-{cascadelake,cooperlake,sapphirerapids,alderlake,zen4}.so "$out/")
cp -L "$(gcc -print-file-name=libgomp.so.1)" "$out/"
strip --strip-unneeded "$out"/* 2>/dev/null || true
tar cJf "$repo/.peers/llama-bin.tar.xz" -C "$(dirname "$out")" llama-bin
ls -la "$repo/.peers/llama-bin.tar.xz"
