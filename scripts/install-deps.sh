#!/usr/bin/env bash
# Installs everything meshtrain needs to build, test and benchmark, from Debian packages only.
# Idempotent: installs only what is missing; the only install step the project has.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  ccache                  # compiles through a cache: scripts/test.sh's CUDA build reuses the ci build's objects
  libdnnl-dev             # oneDNN: GEMM (fp32, bf16 with AVX512-BF16/AMX)
  ocl-icd-opencl-dev      # libdnnl-dev's CMake config does find_package(OpenCL REQUIRED) (only recommended by it)
  nlohmann-json3-dev      # JSON configs, safetensors headers
  libcli11-dev            # command line
  libpcre2-dev            # GPT-2's pre-tokenizer regex (Unicode letter/number classes)
  libutf8proc-dev         # tokenizer.json's NFC normalizer (Qwen2's)
  libxxhash-dev           # checkpoint checksums (XXH3-64 of every file)
  liburing-dev            # ZeRO-Infinity's swap I/O (io_uring, O_DIRECT; src/io/)
  libcpp-httplib-dev      # meshtrain serve's HTTP API (src/serve/)
  curl                    # the serve end-to-end test script calls the API as a user would
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-dev   # scripts/fuzz.sh: libFuzzer and the ASan/UBSan runtimes (clang-14 on bookworm)
  libomp-dev llvm         # OpenMP for clang builds; llvm-symbolizer for readable sanitizer stacks
  libopenmpi-dev openmpi-bin   # comm/: the MPI backend (OpenMPI) and mpirun for multi-rank tests
  iproute2 openssh-server openssh-client  # scripts/netns-hosts.sh: "hosts" as network namespaces,
                                          # an sshd in each, for the multi-host mpirun tests
  fortunes                # real English text for the quick-start demo
  gnuplot-nox             # the loss-curve plot (meshtrain plot, train --metrics)
  debootstrap             # scripts/fresh-machine-check.sh: a clean Debian root for the install check
  python3-torch python3-numpy   # the PyTorch oracle for golden data and the peer benchmark
  python3-jinja2          # the chat-template oracle (Jinja2, as transformers renders chat_template)
  libopenblas0-pthread    # the BLAS a PyTorch user has (netlib reference BLAS makes its fp32 ~20x slower)
  nodejs                  # runs the GPT-2 tokenizer oracle (npm gpt-3-encoder); NOTE: not Debian's
                          # npm package, which conflicts with NodeSource's nodejs (that bundles npm)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
